"""Cutting rows into micro-batches under a row and token budget: shared by the training forward (``trainer.policy``)
and the HF engine's flat prefill (``inference.hf``)."""

from __future__ import annotations

from typing import Sequence

__all__ = ["micro_batches", "rank_groups"]


def micro_batches(shapes: Sequence[tuple[int, int]], *, rows: int, tokens: int = 0, rank: int = 0,
                  world_size: int = 1, prompt_keys: Sequence | None = None) -> tuple[list[list[int]], int]:
    """This rank's micro-batches (indices into ``shapes``) and how many forwards every rank must run.

    ``shapes``: (prompt length, response length) per row. Rank r takes rows r, r + W, ...; they are sorted by
    total length (less padding) and cut into runs of at most ``rows`` rows and, when ``tokens`` > 0, at most
    ``tokens`` padded tokens, i.e. rows x (longest prompt + longest response) as ``pack`` lays them out (verl's
    dynamic batch size: long responses get small micro-batches, short ones large). A row longer than the budget
    on its own gets a micro-batch of its own. Every rank computes every rank's split (no communication), so
    ranks with fewer micro-batches can run dummy forwards to stay in step with FSDP's collectives.

    ``prompt_keys`` (one hashable per row, equal for rows of the same prompt) is for the flat forward: rows of a
    prompt stay together, in order of first appearance, and ``tokens`` counts what the flat forward computes,
    each distinct prompt once plus every response token. Across ranks, whole groups go to one rank (its prompt is
    then computed once on one rank, not once per rank), balanced by those tokens (``rank_groups``).
    """
    def split(idx) -> list[list[int]]:
        out: list[list[int]] = []
        cur: list[int] = []
        P = R = 0
        for i in sorted(idx, key=lambda i: shapes[i][0] + shapes[i][1]):
            p, r = shapes[i][0], max(1, shapes[i][1])
            if cur and (len(cur) == rows or (tokens and (len(cur) + 1) * (max(P, p) + max(R, r)) > tokens)):
                out.append(cur)
                cur, P, R = [], 0, 0
            cur.append(i)
            P, R = max(P, p), max(R, r)
        return out + [cur] if cur else out

    def split_flat(idx) -> list[list[int]]:
        groups: dict = {}
        for i in idx:
            groups.setdefault(prompt_keys[i], []).append(i)
        out: list[list[int]] = []
        cur: list[int] = []
        cost = 0

        def fits(n_rows, c):
            return len(cur) + n_rows <= rows and (not tokens or cost + c <= tokens)

        for members in groups.values():   # a whole group where it fits (its prompt is computed once) ...
            whole = shapes[members[0]][0] + sum(shapes[i][1] for i in members)
            if cur and not fits(len(members), whole) and len(members) <= rows and (not tokens or whole <= tokens):
                out.append(cur)
                cur, cost = [], 0
            if fits(len(members), whole):
                cur.extend(members)
                cost += whole
                continue
            shared = False                # ... else row by row, the prompt counted once per micro-batch
            for i in members:
                add = shapes[i][1] + (0 if shared else shapes[i][0])
                if cur and not fits(1, add):
                    out.append(cur)
                    cur, cost, shared = [], 0, False
                    add = shapes[i][1] + shapes[i][0]
                cur.append(i)
                cost += add
                shared = True
        return out + [cur] if cur else out

    n = len(shapes)
    if prompt_keys is None:
        shards = [range(r, n, world_size) for r in range(world_size)]
        cut = split
    else:
        shards = rank_groups(shapes, prompt_keys, world_size)
        cut = split_flat
    count = max(len(cut(shard)) for shard in shards)
    return cut(shards[rank]), count


def rank_groups(shapes: Sequence[tuple[int, int]], prompt_keys: Sequence, world_size: int) -> list[list[int]]:
    """Each rank's rows when whole groups (rows with equal ``prompt_keys``) go to one rank: the groups, heaviest
    first (the flat forward's tokens: the prompt once plus every response), each to the rank with the fewest
    tokens so far (the lowest rank on a tie; greedy longest-processing-time, within 4/3 of the best split). A
    function of the shapes alone, so every rank computes every rank's share. Rows keep their order within a rank."""
    groups: dict = {}
    for i, key in enumerate(prompt_keys):
        groups.setdefault(key, []).append(i)
    cost = {k: shapes[m[0]][0] + sum(max(1, shapes[i][1]) for i in m) for k, m in groups.items()}
    order = sorted(groups, key=lambda k: (-cost[k], groups[k][0]))
    load, out = [0] * world_size, [[] for _ in range(world_size)]
    for k in order:
        r = min(range(world_size), key=lambda r: (load[r], r))
        load[r] += cost[k]
        out[r].extend(groups[k])
    return [sorted(rows) for rows in out]

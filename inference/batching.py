"""Cutting rows into micro-batches under a row and token budget: shared by the training forward (``trainer.policy``)
and the HF engine's flat prefill (``inference.hf``)."""

from __future__ import annotations

from typing import Sequence

__all__ = ["micro_batches"]


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
    each distinct prompt once plus every response token.
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
    cut = split if prompt_keys is None else split_flat
    count = max(len(cut(range(r, n, world_size))) for r in range(world_size))
    return cut(range(rank, n, world_size)), count

"""DAPO's dynamic sampling: the step's rows, the groups left out, and the fresh groups that replace them.

A group whose grader verdicts are all equal carries no signal (every advantage 0) and is dropped, and so is a
verdict-mixed group whose advantages are all 0 under an advantage that allows it (``trainer.algos.ZERO_ON_MIXED``:
Pass@k Training's when fewer than k responses are wrong, verl's grpo_passk when two tie at the best); a group with a
row the grader could not grade is left out (``ungraded=drop_group``) or kept with reward 0 (``zero``). While fewer
than ``prompts_per_step`` groups remain, fresh on-policy groups are sampled from the data cursor, for at most
``max_sampling_rounds`` rounds (``refill`` says whether: M2PO's stale batch is not refilled by default).

One round usually fills the step: every round of fresh groups that dynamic sampling sizes (the first round of the
on-policy algorithms, every refill) samples ``round_prompts(missing)`` prompts, the fewest that give the missing
informative groups with 90 % probability at the running keep rate (``oversample=0``, auto), or a fixed multiple
(``oversample=3`` is verl's DAPO recipe; ``1`` samples exactly the missing count, a round per halving of it at a
50 % keep rate). Each round waits for its longest response, so on a GPU one large round costs about what one
small one does, and far less than five.

The step trains on its first ``prompts_per_step`` informative groups in loader order (as verl keeps the first
``train_batch_size``). The groups after them in the last round are not trained (``sampling/groups_surplus``) and
their prompts go back to the data cursor: the next step samples them again from its own policy. So a step consumes
the prompts up to its last trained group, exactly the prompts ``oversample=1`` would have consumed for the same
verdicts (verl consumes the whole generation batch: its surplus prompts are skipped for the epoch). The surplus
responses themselves are not carried to the next step: sampled by pi_s, at step s+1 they would be one step stale,
while the on-policy loss takes pi_old to be the step's own policy (r = 1 at the step's single update) and would
train them as on-policy; correcting that needs a behavior policy in the loss, which on-policy DAPO does not have.

The running keep rate (``RolloutBuilder.keep_counts``: decayed counts of informative and sampled groups in sized
rounds) is checkpointed with the builder, so a resumed run sizes its rounds as the uninterrupted one. All ranks hold
all rows and verdicts, so every rank makes the same selection.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import NamedTuple

import torch

from scoring.verdict import UNGRADED_VERDICTS
from trainer.algos import ADVANTAGES, ZERO_ON_MIXED
from trainer.config import Config, adv_kwargs
from trainer.rollout import Rollout, RolloutBuilder, fresh_first_round, split_groups

KEEP_PRIOR = (1.0, 2.0)   # (informative, sampled) pseudo-counts before any sized round: a keep rate of 0.5


class StepRows(NamedTuple):
    rows: list[Rollout]     # every row the step sampled (records, reward and zero-advantage statistics)
    kept: list[Rollout]     # the rows to train on
    # sampling/groups_kept, _dropped, _ungraded, _surplus (these four add up to the groups sampled), extra_rounds,
    # unused_share (rows sampled but not trained / rows sampled), keep_rate (the running estimate after the step)
    metrics: dict


def filter_groups(rows: list[Rollout]) -> tuple[list[Rollout], int]:
    """Keep groups whose grader verdicts are not all equal (DAPO's dynamic sampling on accuracy: an all-wrong
    group of different lengths has no signal even when overlong shaping spreads its rewards); return kept rows
    and the dropped count."""
    kept, dropped = [], 0
    for g in split_groups(rows):
        if len({r.correct for r in g}) > 1:
            kept.extend(g)
        else:
            dropped += 1
    return kept, dropped


def zero_advantage(cfg: Config, group: list[Rollout]) -> bool:
    """Whether the run's advantage (``ADVANTAGES[cfg.advantage]``) gives every row of this verdict-mixed group 0, for
    the entries where that can happen (``ZERO_ON_MIXED``; False for the others, whose verdict filter suffices):
    such a group trains nothing, so dynamic sampling drops it as it drops an all-equal one. E.g. passk with k = 4
    over 8 responses: 1 wrong gives 0 everywhere (every 4-subset holds a correct response), 5 wrong do not."""
    if cfg.advantage not in ZERO_ON_MIXED:
        return False
    rewards = torch.tensor([r.reward for r in group], dtype=torch.float32)
    adv = ADVANTAGES[cfg.advantage](rewards, torch.zeros(len(group), dtype=torch.long), **adv_kwargs(cfg))
    return bool((adv == 0).all())


def filter_ungraded(cfg: Config, rows: list[Rollout]) -> tuple[list[Rollout], int]:
    """``ungraded=drop_group``: leave out every group with a row the grader could not grade (its reward would be a
    guess); ``zero``: keep them with reward 0. Returns the rows to go on with and the number of groups left out."""
    if cfg.ungraded == "zero":
        return rows, 0
    kept, dropped = [], 0
    for g in split_groups(rows):
        if any(r.verdict in UNGRADED_VERDICTS for r in g):
            dropped += 1
        else:
            kept.extend(g)
    return kept, dropped


def refills(cfg: Config) -> bool:
    """Whether dynamic sampling replaces dropped groups with fresh on-policy ones (config ``refill``): by default
    yes, except for M2PO, whose batch stays all-stale as in M2PO's experiments (a fresh group there would need
    the current policy as its behavior policy, which ``refill=fresh`` gives it)."""
    return cfg.refill == "fresh" or (cfg.refill == "auto" and cfg.algorithm != "m2po")


def keep_rate(counts: tuple[float, float] | None) -> float:
    """The running share of informative groups among the groups of sized rounds (the prior 0.5 before any)."""
    informative, sampled = counts or KEEP_PRIOR
    return informative / sampled


def update_keep_counts(counts: tuple[float, float] | None, informative: int, sampled: int, *,
                       decay: float = 0.8) -> tuple[float, float]:
    """The counts after a step whose sized rounds sampled ``sampled`` groups, ``informative`` of them with signal:
    each earlier step (and the prior) weighs ``decay`` times less per step, about the last five steps at 0.8, so
    the estimate follows the keep rate as training moves it (DAPO's falls as the policy learns the easy prompts)."""
    k, n = counts or KEEP_PRIOR
    return decay * k + informative, decay * n + sampled


def binomial_tail(n: int, p: float, need: int) -> float:
    """P(X >= need) for X ~ Binomial(n, p), summed in log space (no underflow at thousands of prompts)."""
    if need <= 0 or p >= 1:
        return 1.0 if need <= n else 0.0
    if need > n or p <= 0:
        return 0.0
    lp, lq, lf = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    below = sum(math.exp(lf - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * lp + (n - k) * lq)
                for k in range(need))
    return max(0.0, 1.0 - below)


def round_prompts(need: int, *, oversample: float, keep_rate: float, confidence: float = 0.9,
                  cap: float = 4.0) -> int:
    """Prompts a round samples for ``need`` more informative groups. A fixed factor (``oversample`` >= 1):
    ceil(oversample * need). Auto (``oversample=0``): the fewest n in [need, cap * need] with
    P(Binomial(n, keep_rate) >= need) >= confidence: the data cursor hands out shuffled prompts, so each is
    informative independently with the keep rate's probability. E.g. need 8 at keep rate 0.5: 21 prompts
    (P = 0.905; 20 give 0.868); need 32: 75 (2.3x); a keep rate of 1: need; of 0 (or under ~0.3 at need 8):
    the cap."""
    if oversample >= 1:
        return math.ceil(oversample * need - 1e-9)   # 1.1 * 10 is 11.000000000000002 in floats
    lo, hi = need, math.ceil(cap * need)
    while lo < hi:   # the tail grows with n: the first n that reaches the confidence
        mid = (lo + hi) // 2
        if binomial_tail(mid, keep_rate, need) >= confidence:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _judge(cfg: Config, group: list[Rollout]) -> str:
    """What dynamic sampling does with a group: ``ungraded`` (left out: ``filter_ungraded``), ``dropped`` (its
    verdicts are all equal: ``filter_groups``; or its advantages are: ``zero_advantage``) or ``informative``."""
    if filter_ungraded(cfg, group)[1]:
        return "ungraded"
    return "dropped" if filter_groups(group)[1] or zero_advantage(cfg, group) else "informative"


def collect_step(builder: RolloutBuilder, cfg: Config, step: int) -> StepRows:
    """The step's rows (all of them, for records and zero-advantage statistics) and the rows to train on. Every
    row gets its ``uid``, its index among the step's rows: the same on every rank (all ranks hold all rows)."""
    out = _collect_step(builder, cfg, step)
    for i, r in enumerate(out.rows):
        r.uid = i
    return out


def _collect_step(builder: RolloutBuilder, cfg: Config, step: int) -> StepRows:
    B = cfg.prompts_per_step
    sizing = cfg.dynamic_sampling and refills(cfg)   # dynamic sampling sizes the fresh rounds: refills, first round
    rate = keep_rate(builder.keep_counts)

    def size(need: int) -> int:
        return round_prompts(need, oversample=cfg.oversample, keep_rate=rate) if sizing else need

    sized = sizing and fresh_first_round(cfg)   # this round's prompts were drawn here, and may go back
    cursor = builder.loader.state_dict()        # where the newest sized round's prompts start
    n = size(B) if sized else B
    rows = builder.collect(step, fresh_prompts=n)
    all_rows = list(rows)
    if not cfg.dynamic_sampling:
        rows, ungraded = filter_ungraded(cfg, rows)
        return StepRows(all_rows, rows, {"sampling/groups_kept": len(split_groups(rows)), "sampling/groups_dropped": 0,
                                         "sampling/groups_ungraded": ungraded, "sampling/groups_surplus": 0,
                                         "sampling/extra_rounds": 0,
                                         "sampling/unused_share": 1 - len(rows) / max(len(all_rows), 1)})
    kept, fates, rounds = [], Counter(), 1
    seen = informative = 0   # the sized rounds' groups, and the informative ones among them
    while True:
        groups = split_groups(rows)
        assert not sized or len(groups) == n, f"a sized round of {n} prompts returned {len(groups)} groups"
        judged = [_judge(cfg, g) for g in groups]
        if sized:   # what sizes the next rounds: every group of this round, the surplus too, has its verdicts
            seen += len(groups)
            informative += judged.count("informative")
        used = len(groups)   # this round's groups up to the step's last trained one
        for i, (g, fate) in enumerate(zip(groups, judged)):
            if len(kept) == B:
                used = i
                break
            fates[fate] += 1
            if fate == "informative":
                kept.append(g)
        if len(kept) == B or not sizing or rounds == cfg.max_sampling_rounds:
            break
        cursor = builder.loader.state_dict()
        n = size(B - len(kept))
        rows = builder.fresh(builder.loader.next(n), step, round_=rounds)
        all_rows.extend(rows)
        sized, rounds = True, rounds + 1
    surplus = len(groups) - used
    if surplus:   # the prompts after the last trained group go back to the cursor (never drawn by a later round)
        assert sized, "only a sized round holds more groups than the step was missing"
        builder.loader.load_state_dict(cursor)
        builder.loader.next(used)
    if seen:
        builder.keep_counts = update_keep_counts(builder.keep_counts, informative, seen)
    kept_rows = [r for g in kept for r in g]
    return StepRows(all_rows, kept_rows, {
        "sampling/groups_kept": len(kept), "sampling/groups_dropped": fates["dropped"],
        "sampling/groups_ungraded": fates["ungraded"], "sampling/groups_surplus": surplus,
        "sampling/extra_rounds": rounds - 1, "sampling/unused_share": 1 - len(kept_rows) / max(len(all_rows), 1),
        "sampling/keep_rate": keep_rate(builder.keep_counts)})

"""DAPO's dynamic sampling: the step's rows, the groups left out, and the fresh groups that replace them.

A group whose grader verdicts are all equal carries no signal (every advantage 0) and is dropped; a group with a
row the grader could not grade is left out (``ungraded=drop_group``) or kept with reward 0 (``zero``). While fewer
than ``prompts_per_step`` groups remain, fresh on-policy groups are sampled from the data cursor, for at most
``max_sampling_rounds`` rounds (``refill`` says whether: M2PO's stale batch is not refilled by default).
"""

from __future__ import annotations

from typing import NamedTuple

from scoring.verdict import UNGRADED_VERDICTS
from trainer.config import Config
from trainer.rollout import Rollout, RolloutBuilder, split_groups


class StepRows(NamedTuple):
    rows: list[Rollout]     # every row the step sampled (records, reward and zero-advantage statistics)
    kept: list[Rollout]     # the rows to train on
    metrics: dict           # sampling/groups_kept, _dropped, _ungraded, extra_rounds


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


def collect_step(builder: RolloutBuilder, cfg: Config, step: int) -> StepRows:
    """The step's rows (all of them, for records and zero-advantage statistics) and the rows to train on. Every
    row gets its ``uid``, its index among the step's rows: the same on every rank (all ranks hold all rows)."""
    out = _collect_step(builder, cfg, step)
    for i, r in enumerate(out.rows):
        r.uid = i
    return out


def _collect_step(builder: RolloutBuilder, cfg: Config, step: int) -> StepRows:
    rows = builder.collect(step)
    all_rows = list(rows)
    rows, ungraded = filter_ungraded(cfg, rows)
    if not cfg.dynamic_sampling:
        return StepRows(all_rows, rows, {"sampling/groups_kept": len(split_groups(rows)), "sampling/groups_dropped": 0,
                                         "sampling/groups_ungraded": ungraded, "sampling/extra_rounds": 0})
    kept, dropped = filter_groups(rows)
    rounds = 1
    while refills(cfg) and len(split_groups(kept)) < cfg.prompts_per_step and rounds < cfg.max_sampling_rounds:
        need = cfg.prompts_per_step - len(split_groups(kept))
        more = builder.fresh(builder.loader.next(need), step, round_=rounds)
        all_rows.extend(more)
        more, ug = filter_ungraded(cfg, more)
        k, dr = filter_groups(more)
        kept.extend(k)
        dropped, ungraded = dropped + dr, ungraded + ug
        rounds += 1
    return StepRows(all_rows, kept, {"sampling/groups_kept": len(split_groups(kept)),
                                     "sampling/groups_dropped": dropped, "sampling/groups_ungraded": ungraded,
                                     "sampling/extra_rounds": rounds - 1})

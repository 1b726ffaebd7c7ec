"""The step-time model of the paper presets on one node of 8 x H100 80 GB (docs/performance.md, "Step-time model"):
the table of ``trainer.plan``'s arithmetic (``step_time`` beside ``verl_step_time``) the page prints and a test
checks. ``python -m trainer.train --config <preset> --dry-run`` prints the same estimate for one preset.

    python -m perf.step_model            # the table for every paper preset

Every assumption (throughputs, MFU, oversampling, response lengths) is stated in ``trainer.plan``'s docstring;
nothing here is measured.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainer.plan import PLANNED_GPUS, SHAPES, StepTime, step_time as _step_time, verl_step_time as _verl

REPO = Path(__file__).resolve().parents[1]
PAPER_PRESETS = ["qwen25math7b_onpolicy", "qwen25math7b_seeds_entropy", "qwen25math7b_seeds_ratio",
                 "r1distill15b_onpolicy", "r1distill15b_seeds_entropy", "qwen3_4b_code_onpolicy",
                 "qwen3_4b_code_seeds_state"]


def load_preset(name: str):
    """The validated ``trainer.config.Config`` of ``trainer/configs/<name>.yaml``."""
    from trainer.config import load_config
    return load_config(str(REPO / "trainer" / "configs" / f"{name}.yaml"), [])


def step_time(cfg, *, gpus: int = PLANNED_GPUS, oversample: float | None = None) -> StepTime:
    return _step_time(cfg, SHAPES[cfg.model], gpus=gpus, oversample=oversample)


def verl_step_time(cfg, *, gpus: int = PLANNED_GPUS) -> StepTime:
    return _verl(cfg, SHAPES[cfg.model], gpus=gpus)


def table(presets=PAPER_PRESETS) -> list[dict]:
    rows = []
    for name in presets:
        cfg = load_preset(name)
        t = step_time(cfg)
        rows.append({"preset": name, "generation s": round(t.generation_s, 1), "update s": round(t.update_s, 1),
                     "refresh s/step": round(t.refresh_s, 1), "validation s/step": round(t.validation_s, 1),
                     "sync s": t.sync_s, "step s": round(t.total_s, 1),
                     "run h": round(t.total_s * cfg.total_steps / 3600, 1), "steps": cfg.total_steps,
                     "verl DAPO step s": round(verl_step_time(cfg).total_s, 1)})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.step_model", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", action="append", default=[], help="a preset name (default: the paper presets)")
    a = p.parse_args(argv)
    rows = table(a.preset or PAPER_PRESETS)
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r[k]) for k in keys) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

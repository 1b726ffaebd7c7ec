"""What a run folder says about its own settings, and a resume that cannot rewrite it.

``runs/<run>/config.yaml`` is the config the run continues with; ``config_history.jsonl`` has one line per launch
(``from_step``, the time, the full config, and the fields that changed since the previous launch), so a run whose
settings changed at step 40 still says what steps 0-39 were trained with. A resume whose training settings differ
from the recorded ones is refused before a model is built (``ResumeChanged``, naming each field with both values)
unless the launch sets ``resume_with_changes=true``; the fields in ``OPERATIONAL`` (where the run writes, how often
it saves, how it batches the same computation, how it reports) may change on any resume. This is the check eval's
results files and the relay's folders make (``contracts.settings``), for a run that is meant to continue.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml

from contracts.config import dump_yaml, to_dict
from contracts.files import append_jsonl
from contracts.settings import describe_diff, settings_diff
from trainer.config import Config

CONFIG = "config.yaml"
HISTORY = "config_history.jsonl"

# Fields a resume may change without asking: they decide where and how the run is written, reported, batched or
# scheduled on the machine, not what it computes (micro-batching is gradient-invariant: tests/trainer/test_train.py).
# total_steps extends or shortens a run (with lr_schedule=constant, the default, it changes no step's update).
OPERATIONAL = frozenset({
    "run_name", "output_dir", "resume", "resume_with_changes", "total_steps", "progress", "tracker", "log_rollouts",
    "save_every", "keep_checkpoints", "keep_resume_states", "export_dtype", "rollout_batch_size", "micro_batch_size",
    "micro_batch_tokens", "gradient_checkpointing", "vllm_gpu_memory_utilization", "vllm_sleep_mode",
    "vllm_max_model_len", "threads", "allow_unisolated",
    # validation scores the policy and picks checkpoints/best; it draws from its own seeds, never the run's
    "val_every", "val_before_train", "val_benchmarks", "val_n", "val_temperature", "val_top_p", "val_top_k",
    "val_max_tokens", "val_template", "val_limit", "val_seed", "select_metric",
})


class ResumeChanged(ValueError):
    """A resume whose training settings differ from the run's recorded config (the message names them)."""


def recorded_config(run_dir: Path) -> dict | None:
    path = Path(run_dir) / CONFIG
    if not path.is_file():
        return None
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ResumeChanged(f"{path}: not valid YAML ({exc}); restore it, or start a new run (another run_name)") \
            from None
    return data if isinstance(data, dict) else None


def training_changes(cfg: Config, recorded: dict) -> list[tuple[str, object, object]]:
    """(field, recorded, now) for every training setting that differs; fields the recorded config lacks (added
    after it was written) count as their default then."""
    keys = [k for k in to_dict(cfg) if k not in OPERATIONAL]
    if cfg.lr_schedule != "constant" or recorded.get("lr_schedule", "constant") != "constant":
        keys.append("total_steps")   # a decaying schedule is stretched over total_steps
    return settings_diff(recorded, to_dict(cfg), keys, defaults=to_dict(Config()))


def check_resume(run_dir: Path, cfg: Config, *, resuming: bool) -> None:
    """ResumeChanged when ``resuming`` into a run whose recorded training settings differ and the launch does not
    set ``resume_with_changes``."""
    recorded = recorded_config(run_dir) if resuming else None
    if recorded is None or cfg.resume_with_changes:
        return
    diff = training_changes(cfg, recorded)
    if diff:
        raise ResumeChanged(
            f"{Path(run_dir)} was trained with other settings than this launch ({describe_diff(diff)}): resuming "
            f"would continue it under a config.yaml that misdescribes its earlier steps. Start a new run "
            f"(run_name=...), drop the overrides, or set resume_with_changes=true to continue and record the change "
            f"in {HISTORY}")


def record_launch(run_dir: Path, cfg: Config, *, from_step: int) -> dict:
    """Write ``config.yaml`` (the settings the run continues with) and append this launch to the history; a run
    that predates the history gets its recorded config as the first line. Returns the line appended."""
    run_dir = Path(run_dir)
    history = run_dir / HISTORY
    previous = recorded_config(run_dir) if from_step > 0 else None
    if previous is not None and not history.is_file():
        append_jsonl(history, {"from_step": 0, "launched": None, "config": previous, "changed": {}})
    now = to_dict(cfg)
    changed = {k: {"was": a, "now": b} for k, a, b in settings_diff(previous, now, defaults=to_dict(Config()))} if previous else {}
    line = {"from_step": from_step, "launched": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "config": now,
            "changed": changed}
    append_jsonl(history, json.loads(json.dumps(line, default=str)))
    dump_yaml(cfg, run_dir / CONFIG)
    return line

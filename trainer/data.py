"""Training prompts: load rows (local JSONL / JSON array, a hub dataset, or an embedded task) and hand out batches.

Rows are validated at load time: a malformed line or a row without the prompt or answer field fails with the
file and line named. The loader's position (epoch, offset) is part of the checkpoint, so a resumed run sees the
same prompts in the same order.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


class DataError(ValueError):
    """A training data file that cannot be used; the message names the file, line and field."""


def read_rows(path: str | Path) -> list[tuple[int, dict]]:
    """(line number, row) for a JSONL file or a JSON array file; errors name file and line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"training data file '{path}' does not exist")
    text = path.read_text()
    if path.suffix == ".json" or text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(rows, list):
            raise DataError(f"{path}: a .json data file must hold a JSON array of objects")
        out = list(enumerate(rows, start=1))
    else:
        out = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                out.append((lineno, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: not valid JSON ({exc.msg}); each line must be one JSON object") from None
    for lineno, row in out:
        if not isinstance(row, dict):
            raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
    return out


def load_examples(cfg) -> list[dict]:
    """Rows with 'id', 'prompt', 'answer' (and the off-policy field when present), from cfg's source."""
    required = [cfg.prompt_key, cfg.answer_key]
    if cfg.algorithm == "luffy":
        required.append(cfg.off_policy_key)
    if not cfg.train_file:
        from scoring.tasks import get_task
        task = get_task(cfg.task)
        rows = task.make_examples(cfg.num_train_examples, seed=cfg.seed, **cfg.task_kwargs)
        source = f"task '{cfg.task}'"
        numbered = list(enumerate(rows, start=1))
    elif Path(cfg.train_file).exists():
        numbered = read_rows(cfg.train_file)
        source = cfg.train_file
    else:
        numbered = list(enumerate(_load_hub(cfg.train_file, cfg.train_subset), start=1))
        source = f"hub dataset '{cfg.train_file}'"
    examples = []
    for lineno, row in numbered:
        values = {}
        for key in required:
            values[key] = get_field(row, key)
            if values[key] is None:
                raise DataError(f"{source}:{lineno}: row has no field '{key}' (fields: {sorted(row)}); "
                                f"set prompt_key/answer_key/off_policy_key to the right column")
        ex = dict(row)
        ex["prompt"] = _message_text(values[cfg.prompt_key])
        ex["answer"] = values[cfg.answer_key]
        if cfg.algorithm == "luffy":
            ex[cfg.off_policy_key] = _message_text(values[cfg.off_policy_key])
        ex["id"] = str(row.get("id", lineno))
        examples.append(ex)
    if not examples:
        raise DataError(f"{source}: no training rows")
    if 0 < cfg.max_train_examples < len(examples):
        pick = np.random.default_rng([cfg.seed, 4608]).choice(len(examples), cfg.max_train_examples, replace=False)
        examples = [examples[i] for i in sorted(pick)]
    return examples


def get_field(row: dict, key: str):
    """``row[key]``, where a dotted key reaches into nested mappings (reward_model.ground_truth)."""
    if key in row:
        return row[key]
    value = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _message_text(value) -> str:
    # verl-style rows hold chat messages; take the last turn's content.
    if isinstance(value, list) and value and isinstance(value[-1], dict) and "content" in value[-1]:
        return str(value[-1]["content"])
    return str(value)


def _load_hub(name: str, subset: str = "") -> list[dict]:
    try:
        import datasets
    except ImportError:
        raise DataError(f"train_file '{name}' is not a local file; to read it from the hub install `datasets`, "
                        f"or download it and point train_file at the local copy") from None
    try:
        return list(datasets.load_dataset(name, subset or None, split="train"))
    except Exception as exc:  # offline, unknown id, ...
        raise DataError(f"could not load hub dataset '{name}' ({exc}); point train_file at a local file") from None


class PromptLoader:
    """Shuffled epochs over example indices; the state is (epoch, offset) and fully determines the order."""

    def __init__(self, n: int, *, seed: int):
        self.n, self.seed = n, seed
        self.epoch, self.offset = 0, 0
        self._perm = self._permutation(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.n)

    def next(self, count: int) -> list[int]:
        out = []
        while len(out) < count:
            if self.offset == self.n:
                self.epoch, self.offset = self.epoch + 1, 0
                self._perm = self._permutation(self.epoch)
            take = min(count - len(out), self.n - self.offset)
            out.extend(int(i) for i in self._perm[self.offset:self.offset + take])
            self.offset += take
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset, "n": self.n, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state["n"] != self.n:
            raise DataError(f"the checkpoint was written with {state['n']} training rows but the data now has "
                            f"{self.n}; resume with the same data or start a new run")
        self.epoch, self.offset = state["epoch"], state["offset"]
        self._perm = self._permutation(self.epoch)

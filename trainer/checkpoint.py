"""Checkpoints: a Hugging Face model directory plus ``trainer_state/``, written atomically.

``runs/<run>/checkpoints/step_NNNNNN/`` loads with ``AutoModelForCausalLM.from_pretrained`` (and vLLM);
``trainer_state/state.pt`` beside the weights holds the optimizer, scheduler, RNG states, data cursor and the
Thinking Seeds buffer. A checkpoint is first written under ``step_NNNNNN.tmp`` and renamed when complete, so a
run killed mid-write never leaves a directory that resume would trust.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

_STEP_DIR = re.compile(r"^step_(\d{6})$")
STATE_FILE = Path("trainer_state") / "state.pt"


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{step:06d}"


def save_checkpoint(run_dir: Path, step: int, *, model, tokenizer, model_state: dict, trainer_state: dict,
                    keep: int = 0) -> Path:
    """Write the checkpoint of ``step`` (call on rank 0 only); prune older ones beyond ``keep``."""
    final = checkpoint_dir(run_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, state_dict=model_state, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / STATE_FILE).parent.mkdir()
    torch.save(trainer_state, tmp / STATE_FILE)
    if final.exists():  # re-saving the same step (e.g. resumed run ending at a saved step)
        shutil.rmtree(final)
    os.replace(tmp, final)
    if keep > 0:
        for old in list_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old[1], ignore_errors=True)
    return final


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints (renamed into place, holding trainer_state), oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and (p / STATE_FILE).is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def find_resume_checkpoint(run_dir: Path, resume: str) -> Path | None:
    if resume == "never":
        return None
    if resume == "auto":
        ckpts = list_checkpoints(run_dir)
        return ckpts[-1][1] if ckpts else None
    path = Path(resume)
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"resume={resume}: no {STATE_FILE} there; point resume at a checkpoints/step_N directory")
    return path


def load_trainer_state(ckpt: Path) -> dict:
    return torch.load(Path(ckpt) / STATE_FILE, map_location="cpu", weights_only=False)


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def truncate_metrics(path: Path, last_step: int) -> None:
    """Drop metric lines logged after ``last_step`` (a run killed after its last checkpoint logged them)."""
    path = Path(path)
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= last_step:
                keep.append(line)
        except (json.JSONDecodeError, KeyError):
            break  # a half-written last line
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in keep))
    os.replace(tmp, path)

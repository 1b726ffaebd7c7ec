"""Checkpoints: a Hugging Face model directory plus ``trainer_state/``, written atomically by all ranks together.

    runs/<run>/checkpoints/step_NNNNNN/
        config.json, generation_config.json, tokenizer files
                                           (a LoRA run, lora_rank > 0: adapter_config.json and
                                           adapter_model.safetensors, PEFT's format, in place of the model; merged/
                                           the merged model with export_merged; trainer/lora.py)
        model.safetensors                  the weights in ``export_dtype`` (default the compute dtype: bf16 on CUDA),
                                           or model-0000k-of-0000K.safetensors + model.safetensors.index.json above
                                           5 GB; transformers and vLLM load it (config.json's dtype says which)
        trainer_state/                     what resume needs (only the newest ``keep_resume_states`` checkpoints)
            meta.json                      format version, step, world size that wrote it
            state.pt                       scheduler, data cursor, seed buffer / stale queue, RNG (each rank's own
                                           CUDA generator), token count, config
            dcp/                           model and AdamW state, torch.distributed.checkpoint: one file per rank

Nothing is gathered for resume: every rank writes and reads only its own shards of model and optimizer state
(``trainer.fsdp.save_sharded``/``load_sharded``), and DCP reshards by parameter name, so a run saved on N ranks
resumes on M. The Hugging Face export is written by rank 0 from a streamed gather (one full tensor at a time,
``trainer.fsdp.stream_full_state``), so no GPU ever holds the whole model. Every checkpoint gets the export (the
paper selects the checkpoint to evaluate among all saved steps); ``keep_checkpoints`` bounds how many exports stay,
``keep_resume_states`` how many keep their much larger ``trainer_state/`` (fp32 weights + two AdamW moments:
12 bytes per parameter, ~91 GB at 7B; the export is 2 bytes per parameter in bf16, 15 GB at 7B, 4 in fp32). The
export is for evaluation and for starting new runs; resume reads the fp32 masters from ``trainer_state/`` only.

A checkpoint is first written under ``step_NNNNNN.tmp`` and renamed when every rank has finished, so a run killed
mid-write never leaves a directory resume would trust. Rank 0 picks the checkpoint to resume and tells the others;
ranks that do not see rank 0's run directory (node-local ``runs/`` on several nodes) stop with a clear error.
One trainer writes a run folder at a time: rank 0 holds ``<run>/.train.lock`` for the whole run (``run_lock``,
``contracts.locks``), so a second launch on the same folder is refused before it writes anything; a launch of a
run already at ``total_steps`` says so and trains nothing (``already_trained``).
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
import secrets
import shutil
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Collection, Iterator, NamedTuple

import numpy as np
import torch
from safetensors.torch import save_file

from contracts.config import to_dict
from contracts.files import atomic_write_json, atomic_write_text, temporary_path
from contracts.locks import LockHeld, acquire
from trainer.config import Config, val_eval_command, validation_on
from inference.hub import holds_model
from trainer.fsdp import (Dist, all_gather_objects, barrier, broadcast_object, load_sharded, save_sharded,
                          stream_full_state)
from trainer.lora import ADAPTER, adapter_state, base_folder, has_adapters, merged_state, write_adapter
from trainer.policy import resolve_dtype

FORMAT = 2   # 1: full model in model.safetensors + full optimizer in state.pt (before sharded checkpoints)
_STEP_DIR = re.compile(r"^step_(\d{6})$")
STATE_DIR = Path("trainer_state")
STATE_FILE = STATE_DIR / "state.pt"
META_FILE = STATE_DIR / "meta.json"
DCP_DIR = STATE_DIR / "dcp"
MAX_SHARD_BYTES = 5 * 10**9   # as save_pretrained's default "5GB"


class CheckpointError(RuntimeError):
    """A checkpoint or run directory that cannot be used as asked; the message says what to do."""


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{step:06d}"


# ----------------------------------------------------------------------------------------------------------
# save
# ----------------------------------------------------------------------------------------------------------
def save_checkpoint(run_dir: Path, step: int, *, model, optimizer, tokenizer, trainer_state: dict | None, d: Dist,
                    keep: int = 0, keep_resume: int = 1, export_dtype: torch.dtype | None = None,
                    protect: Collection[int] = (), export_merged: bool = False) -> Path:
    """Write the checkpoint of ``step``; every rank calls it (``trainer_state`` is read on rank 0 only). Then prune
    (rank 0): exports beyond the newest ``keep`` (0 = all) except the steps in ``protect`` (the best checkpoint),
    resume states beyond the newest ``keep_resume``. ``export_dtype``: the dtype of the Hugging Face export's
    floating tensors (None: the parameters' own). A model with LoRA adapters exports the adapter instead
    (``write_lora_export``; ``export_merged``: also the merged model)."""
    final = checkpoint_dir(run_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    if d.is_main:
        if tmp.exists():
            shutil.rmtree(tmp)
        (tmp / STATE_DIR).mkdir(parents=True)
    barrier(d)
    save_sharded(model, optimizer, tmp / DCP_DIR, d)
    if has_adapters(model):
        write_lora_export(tmp, run_dir, model, tokenizer, d, dtype=export_dtype, merged=export_merged)
    else:
        write_hf_export(tmp, model, tokenizer, d, dtype=export_dtype)
    if d.is_main:
        torch.save(trainer_state, tmp / STATE_FILE)
        meta = {"format": FORMAT, "step": step, "world_size": d.world_size}
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1) + "\n")
        if final.exists():  # re-saving the same step (e.g. a resumed run ending at a saved step)
            shutil.rmtree(final)
        os.replace(tmp, final)
        prune(run_dir, keep=keep, keep_resume=keep_resume, protect=protect)
    barrier(d)
    return final


def write_hf_export(out: Path, model, tokenizer, d: Dist, *, dtype: torch.dtype | None = None,
                    max_shard_bytes: int = MAX_SHARD_BYTES, tensors=None) -> None:
    """A Hugging Face model directory in ``out``: rank 0 writes safetensors shards of at most ``max_shard_bytes``
    while every rank streams the full tensors (collective). Floating tensors are written in ``dtype`` (cast on each
    rank's shard before the gather), or in their own (master) dtype when None; config.json's ``dtype`` is what the
    files hold. ``tensors``: another stream of (name, tensor on rank 0 / None) to write, e.g. a LoRA model merged
    (``trainer.lora.merged_state``); default ``stream_full_state(model, d, dtype=dtype)``."""
    out = Path(out)
    if d.is_main:
        out.mkdir(parents=True, exist_ok=True)
    parts, shard, size, index, written = [], {}, 0, {}, None

    def flush():
        nonlocal shard, size
        if shard:
            name = f"part-{len(parts):05d}.safetensors"
            save_file(shard, str(out / name), metadata={"format": "pt"})
            parts.append((name, list(shard)))
        shard, size = {}, 0

    for name, tensor in (tensors if tensors is not None else stream_full_state(model, d, dtype=dtype)):
        if tensor is None:   # not rank 0: the gather happened, nothing to keep
            continue
        nbytes = tensor.numel() * tensor.element_size()
        if shard and size + nbytes > max_shard_bytes:
            flush()
        shard[name] = tensor.contiguous()
        size += nbytes
        if tensor.is_floating_point():
            written = written or tensor.dtype
    if not d.is_main:
        return
    flush()
    total = sum(p.stat().st_size for p in out.glob("part-*.safetensors"))
    if len(parts) == 1:
        os.replace(out / parts[0][0], out / "model.safetensors")
    else:
        for k, (name, keys) in enumerate(parts):
            final = f"model-{k + 1:05d}-of-{len(parts):05d}.safetensors"
            os.replace(out / name, out / final)
            index.update({key: final for key in keys})
        (out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": index}, indent=1) + "\n")
    config = copy.deepcopy(model.config)
    if written is not None:
        config.dtype = written   # what the files hold, so dtype="auto" loads the weights as stored
    config.save_pretrained(out)
    generation = getattr(model, "generation_config", None)
    if generation is not None:
        generation.save_pretrained(out)
    tokenizer.save_pretrained(out)


def write_lora_export(out: Path, run_dir: Path, model, tokenizer, d: Dist, *, dtype: torch.dtype | None,
                      merged: bool) -> None:
    """A LoRA run's export in ``out`` (collective): the adapter in PEFT's format (``trainer.lora.write_adapter``:
    adapter_config.json naming the base, adapter_model.safetensors in the master dtype, the tokenizer), and with
    ``merged`` a full Hugging Face model of base + adapter in ``out/merged`` (``dtype``). A base built in memory
    (``tiny:``) is first written once to the run folder (``trainer.lora.base_folder``), which the adapter names."""
    base = model.peft_config[ADAPTER].base_model_name_or_path or base_folder(
        run_dir, model, tokenizer, d, dtype=dtype,
        write_export=lambda path, tensors: write_hf_export(path, model, tokenizer, d, tensors=tensors))
    state = adapter_state(model)   # collective: every rank gathers, rank 0 writes
    if d.is_main:
        write_adapter(out, model, tokenizer, base=base, state=state)
    if merged:
        write_hf_export(Path(out) / "merged", model, tokenizer, d, tensors=merged_state(model, d, dtype=dtype))


def prune(run_dir: Path, *, keep: int, keep_resume: int, protect: Collection[int] = ()) -> None:
    """Remove checkpoints beyond the newest ``keep`` (0 = none removed), except the steps in ``protect`` (the best
    checkpoint: kept besides the newest ``keep``, as TRL's save_total_limit keeps the best model), and
    ``trainer_state/`` of those beyond the newest ``keep_resume`` (a checkpoint without it stays an evaluable model,
    not a resume point; a protected one keeps its model). The state is renamed away before deletion, so a kill
    mid-delete never leaves a half state that resume would pick."""
    steps = sorted((int(m.group(1)), p) for p in (Path(run_dir) / "checkpoints").iterdir()
                   if (m := _STEP_DIR.match(p.name)))
    if keep > 0:
        for step, path in steps[:-keep]:
            if step not in protect:
                shutil.rmtree(path, ignore_errors=True)
        steps = [(step, path) for step, path in steps if path.exists()]
    for _, path in steps[:-keep_resume] if keep_resume > 0 else []:
        if (path / STATE_DIR).exists():
            gone = path / "trainer_state.pruned"
            os.replace(path / STATE_DIR, gone)
            shutil.rmtree(gone, ignore_errors=True)


# ----------------------------------------------------------------------------------------------------------
# resume
# ----------------------------------------------------------------------------------------------------------
def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """Resumable checkpoints (renamed into place, holding trainer_state), oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and (p / STATE_FILE).is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def damaged(path: Path) -> str | None:
    """Why the checkpoint ``path`` cannot be resumed (its format, its DCP metadata, a rank's shard missing), or
    None. Cheap: file names and meta.json only, nothing loaded."""
    try:
        meta = check_format(path)
    except CheckpointError as exc:
        return str(exc)
    ranks = meta.get("world_size")
    if isinstance(ranks, int):
        missing = [f"__{r}_0.distcp" for r in range(ranks) if not (path / DCP_DIR / f"__{r}_0.distcp").is_file()]
        if missing:
            return f"{path / DCP_DIR} is missing the shard(s) {', '.join(missing)} of its {ranks} rank(s)"
    return None


_SKIP_SAID: set[tuple[Path, Path]] = set()   # (damaged, taken) pairs this process has warned about


def find_resume_checkpoint(run_dir: Path, resume: str) -> Path | None:
    """The checkpoint a run resumes from: ``never`` none; ``auto`` the newest that is complete (a damaged newer one
    is skipped, saying so on stderr, rather than failed on at every launch; the newest is returned when all are
    damaged, so the error names it); else the folder ``resume`` names."""
    if resume == "never":
        return None
    if resume == "auto":
        ckpts = list_checkpoints(run_dir)
        newest_why = None
        for step, path in reversed(ckpts):
            why = damaged(path)
            if why is None:
                if path != ckpts[-1][1] and (ckpts[-1][1], path) not in _SKIP_SAID:
                    _SKIP_SAID.add((ckpts[-1][1], path))   # a launch looks for its checkpoint more than once
                    print(f"warning: resuming from {path} (step {step + 1}), the newest complete checkpoint: "
                          f"{ckpts[-1][1]} cannot be resumed ({newest_why})", file=sys.stderr)
                return path
            newest_why = newest_why or why
        return ckpts[-1][1] if ckpts else None
    path = Path(resume)
    if not (path / STATE_FILE).is_file():
        raise CheckpointError(f"resume={resume}: no {STATE_FILE} there (a checkpoint whose resume state was pruned "
                              f"by keep_resume_states is a model only); point resume at a checkpoints/step_N "
                              f"directory that has one")
    return path


def agree_resume_checkpoint(run_dir: Path, resume: str, d: Dist) -> Path | None:
    """Rank 0 decides which checkpoint the run resumes from and tells every rank (each deciding alone would let a
    rank that sees another directory start from scratch while the others resume: a hang). A rank that cannot see
    the chosen checkpoint stops the run with an error on every rank."""
    choice = None
    error = None
    if d.is_main:
        try:
            found = find_resume_checkpoint(run_dir, resume)
            choice = None if found is None else str(found)
        except CheckpointError as exc:
            error = str(exc)
    choice, error = broadcast_object((choice, error), d)
    if error:
        raise CheckpointError(error)
    if choice is None:
        return None
    path = Path(choice)
    seen = all_gather_objects(((path / STATE_FILE).is_file(), socket.gethostname()), d)
    blind = [f"rank {r} ({host})" for r, (ok, host) in enumerate(seen) if not ok]
    if blind:
        raise CheckpointError(f"rank 0 resumes from {path}, which {', '.join(blind)} cannot see: every rank must see "
                              f"the same output_dir (a filesystem shared by all nodes)")
    check_format(path)
    return path


def check_format(path: Path) -> dict:
    """The checkpoint's meta.json, or a CheckpointError naming what wrote it and what to do."""
    path = Path(path)
    meta_file = path / META_FILE
    if not meta_file.is_file():
        raise CheckpointError(
            f"{path} was written by an older version of the trainer (format 1: full optimizer state in {STATE_FILE}, "
            f"no sharded {DCP_DIR}/), which this version cannot resume. Its weights are a Hugging Face model: start a "
            f"new run from them with model={path} resume=never (the optimizer state starts fresh), or finish the run "
            f"with the version that wrote it")
    try:
        meta = json.loads(meta_file.read_text())
        fmt = int(meta["format"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        raise CheckpointError(f"{meta_file} is not a checkpoint description this trainer wrote; point resume at "
                              f"another checkpoint or set resume=never") from None
    if fmt != FORMAT:
        raise CheckpointError(f"{path} has checkpoint format {fmt}, this trainer reads format {FORMAT}: resume it "
                              f"with the version that wrote it, or start a new run from its weights "
                              f"(model={path} resume=never)")
    if not (path / DCP_DIR / ".metadata").is_file():
        raise CheckpointError(f"{path / DCP_DIR} is incomplete (no .metadata): the checkpoint was damaged after it "
                              f"was written; resume from an earlier one (resume=<path>) or set resume=never")
    return meta


def load_checkpoint(path: Path, *, model, optimizer, d: Dist) -> dict:
    """Load model and optimizer shards into this rank (whatever world size wrote them); returns trainer_state."""
    check_format(path)
    load_sharded(model, optimizer, Path(path) / DCP_DIR, d)
    return load_trainer_state(path)


def load_trainer_state(ckpt: Path) -> dict:
    return torch.load(Path(ckpt) / STATE_FILE, map_location="cpu", weights_only=False)


RUN_LOCK = ".train.lock"   # <run>/.train.lock: held by the process that writes the run (contracts.locks)


@contextmanager
def run_lock(run_dir: Path, d: Dist) -> Iterator[None]:
    """One trainer per run folder, for the block: rank 0 (the process that writes metrics, records and the config;
    on several nodes, the first rank of the first) takes ``<run>/.train.lock`` before anything is written and holds
    it until the run ends, however it ends. The other ranks take no lock and wait on nothing: rank 0 tells them the
    outcome (one broadcast, after a non-blocking try), so a refused launch stops every rank at once and no rank
    waits on a lock. ``LockHeld`` (bad input) on every rank when another process writes the run folder; a lock a
    dead trainer left behind is taken over with a warning on stderr."""
    lock, error, said = None, None, None
    if d.is_main:
        try:
            lock = acquire(Path(run_dir) / RUN_LOCK, what=f"the run folder {run_dir}", command="trainer.train",
                           fix="wait for that run to end (or stop it), or give this one another run_name")
        except Exception as exc:   # told to every rank before rank 0 raises it: no rank is left waiting
            error, said = exc, (isinstance(exc, LockHeld), str(exc))
    said = broadcast_object(said, d)
    if error is not None:
        raise error
    if said is not None:
        raise LockHeld(said[1]) if said[0] else RuntimeError(f"rank 0 could not lock the run folder: {said[1]}")
    if lock is not None and lock.stale:
        print(f"warning: {lock.stale}", file=sys.stderr, flush=True)
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def already_trained(run_dir: Path, cfg: Config, d: Dist) -> str | None:
    """The line a launch of a run that has reached ``total_steps`` prints instead of loading a model to train no
    step (rank 0 decides, every rank gets it; ``finished_line``), or None when there is a step to train: the
    checkpoint the run would resume from (``resume``: auto, the newest; or the one it names) is at step
    ``total_steps - 1`` or later."""
    line = None
    if d.is_main:
        try:
            path = find_resume_checkpoint(run_dir, cfg.resume)
        except CheckpointError:   # said on every rank when the run resumes (agree_resume_checkpoint)
            path = None
        m = _STEP_DIR.match(path.name) if path is not None else None
        try:   # a checkpoint this trainer cannot read is said where the resume reads it (bad input), not here
            readable = m is not None and check_format(path) is not None
        except CheckpointError:
            readable = False
        if readable and int(m.group(1)) + 1 >= cfg.total_steps:
            line = finished_line(run_dir, cfg, step=int(m.group(1)), path=path)
    return broadcast_object(line, d)


def finished_line(run_dir: Path, cfg: Config, *, step: int, path: Path) -> str:
    """What a launch of a run whose checkpoint ``path`` is at ``step`` >= ``total_steps - 1`` says, in one line: at
    total_steps, or past it (a smaller total_steps does not shorten a run: its later checkpoints stay, and the model
    of step total_steps - 1 is named where it is kept), that nothing was trained or written, how to train further;
    and with validation on (the command docs/training.md gives, run on a finished run), that no step was validated
    (only the steps a launch trains are) and the ``eval.run`` command that scores the checkpoint the same way."""
    if step + 1 == cfg.total_steps:
        line = (f"already at total_steps={cfg.total_steps}: {run_dir} has trained steps 0-{step} (checkpoint {path}), "
                f"so there is nothing to train and nothing was written; to train further raise total_steps "
                f"(total_steps=N: a resume may change it), for a new run give another run_name")
    else:
        model = checkpoint_dir(run_dir, cfg.total_steps - 1)
        kept = f"; its model after step {cfg.total_steps - 1} is {model}" if holds_model(model) else ""
        line = (f"already past total_steps={cfg.total_steps}: {run_dir} is at step {step} (trained steps 0-{step}, "
                f"checkpoint {path}) and a relaunch does not shorten a run, so nothing was trained and nothing was "
                f"written{kept}; to train further set total_steps above {step + 1} (total_steps=N: a resume may "
                f"change it), for a new run give another run_name")
    if validation_on(cfg):
        line += (f"; validation scores only the steps a launch trains, so nothing was validated: to score {path} as "
                 f"validation would, run {val_eval_command(cfg, path)}")
    return line


def check_shared_run_dir(run_dir: Path, d: Dist) -> None:
    """Every rank must see the run directory rank 0 writes (checkpoints are written by all ranks into one folder
    and resumed from it). Rank 0 writes a random token there; a rank that cannot read it back stops the run, on
    every rank at once, with an error naming the ranks and hosts. A no-op on one process."""
    run_dir = Path(run_dir)
    if not d.enabled:
        run_dir.mkdir(parents=True, exist_ok=True)
        return
    token = broadcast_object(secrets.token_hex(8) if d.is_main else None, d)
    probe = run_dir / f".rank_probe_{token}"
    if d.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe.write_text(token)
    barrier(d)
    try:
        ok = probe.read_text() == token
    except OSError:
        ok = False
    seen = all_gather_objects((ok, socket.gethostname()), d)
    barrier(d)
    if d.is_main:
        probe.unlink(missing_ok=True)
    blind = [f"rank {r} ({host})" for r, (good, host) in enumerate(seen) if not good]
    if blind:
        raise CheckpointError(
            f"{', '.join(blind)} cannot see {run_dir}, the run directory rank 0 ({seen[0][1]}) writes: every rank "
            f"must see the same output_dir, because all ranks write each checkpoint into it and resume from it. On "
            f"several nodes put output_dir on a filesystem they share (e.g. output_dir=/shared/runs)")


def remove_partial_saves(run_dir: Path) -> None:
    """Delete ``step_N.tmp`` folders a killed save left behind (rank 0, at start; resume never reads them)."""
    root = Path(run_dir) / "checkpoints"
    if root.is_dir():
        for p in root.glob("step_*.tmp"):
            shutil.rmtree(p, ignore_errors=True)


# ----------------------------------------------------------------------------------------------------------
# the best checkpoint (validation: trainer/validate.py)
# ----------------------------------------------------------------------------------------------------------
BEST_LINK = "best"          # checkpoints/best -> step_NNNNNN, a relative symlink
BEST_FILE = "best.json"     # checkpoints/best.json: {"step", "metric", "value", "checkpoint"}


def read_best(run_dir: Path) -> dict | None:
    """``checkpoints/best.json`` (None when there is none, or it is not one this trainer wrote)."""
    path = Path(run_dir) / "checkpoints" / BEST_FILE
    try:
        best = json.loads(path.read_text())
        return best if isinstance(best, dict) and {"step", "metric", "value"} <= set(best) else None
    except (OSError, ValueError):
        return None


def write_best(run_dir: Path, best: dict) -> None:
    """``best.json``, then the ``best`` link to ``checkpoints/step_N`` (relative, so the run folder can move), each
    replaced atomically (``os.replace`` of a temporary file or link): a reader sees the old best or the new one."""
    root = Path(run_dir) / "checkpoints"
    atomic_write_json(root / BEST_FILE, best)
    link = root / BEST_LINK
    tmp = temporary_path(link)
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(checkpoint_dir(run_dir, best["step"]).name, tmp)
    os.replace(tmp, link)


def clear_best(run_dir: Path) -> None:
    root = Path(run_dir) / "checkpoints"
    for p in (root / BEST_LINK, root / BEST_FILE):
        if p.is_symlink() or p.is_file():
            p.unlink()


def best_record(step: int, metric: str, value: float) -> dict:
    return {"step": step, "metric": metric, "value": value, "checkpoint": checkpoint_dir(Path("."), step).name}


def better(value: float | None, best: dict | None) -> bool:
    """Whether a validated step with select value ``value`` becomes the best: strictly higher than the best so far
    (ties keep the earlier step, as TRL's greater_is_better comparison)."""
    return value is not None and (best is None or value > best["value"])


def best_so_far(run_dir: Path, selection, *, before_step: int) -> dict | None:
    """The best validated checkpoint of the steps before ``before_step`` (a resumed run continues with it): the
    argmax of ``selection.value`` (``trainer.validate.Selection``) over the lines of ``metrics.jsonl`` (steps >= 0;
    the before-training baseline is no candidate) whose checkpoint folder holds a model, the earliest on ties.
    ``best.json`` and the link are rewritten when they say otherwise (a resume from an earlier checkpoint, a kill
    between the save and the link, a changed ``select_metric``), removed when there is none."""
    path = Path(run_dir) / "metrics.jsonl"
    best = None
    lines = path.read_text().splitlines() if path.is_file() else []
    for line in lines:
        try:
            m = json.loads(line)
        except ValueError:
            continue   # a half-written last line
        step = m.get("step")
        if not isinstance(step, int) or not 0 <= step < before_step:
            continue
        value = selection.value(m)
        if better(value, best) and holds_model(checkpoint_dir(run_dir, step)):
            best = best_record(step, selection.metric, value)
    recorded = read_best(run_dir)
    if best is None:
        if recorded is not None or (Path(run_dir) / "checkpoints" / BEST_LINK).is_symlink():
            clear_best(run_dir)
    elif recorded != best or not (Path(run_dir) / "checkpoints" / BEST_LINK).is_symlink():
        write_best(run_dir, best)
    return best


def keep_best(run_dir: Path, best: dict, cfg: Config) -> None:
    """Record ``best`` (``write_best``) and prune again with only it protected: the save before it protected the
    previous best as well, so that a kill between the save and the link never leaves the link dangling."""
    write_best(run_dir, best)
    prune(run_dir, keep=cfg.keep_checkpoints, keep_resume=cfg.keep_resume_states, protect={best["step"]})


# ----------------------------------------------------------------------------------------------------------
# RNG and metrics
# ----------------------------------------------------------------------------------------------------------
def rng_state(d: Dist) -> dict:
    """The RNG states a resumed run restores (collective; rank 0 saves the result): Python's, numpy's and torch's
    CPU generator (this rank's; every rank restores rank 0's), and under ``"cuda"`` every rank's own CUDA
    generator (this device's state only, ``torch.cuda.get_rng_state()``), a list by rank, None entries without
    CUDA. Not every device the process can see (``get_rng_state_all``): that list's length is the visible GPU
    count, and restoring it where fewer are visible fails."""
    cuda = torch.cuda.get_rng_state() if torch.cuda.is_available() else None
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": all_gather_objects(cuda, d)}


def set_rng_state(state: dict, *, rank: int = 0) -> None:
    """Restore what ``rng_state`` saved; rank ``rank`` sets its current CUDA device's generator to the entry saved
    by that rank. A rank the checkpoint did not have (resumed on more ranks) keeps its seeded CUDA state.
    Checkpoints written before ``rng_state`` saved by rank hold rank 0's ``get_rng_state_all()`` (one entry per
    device it saw): read the same way, rank r takes entry r, which on one node is the state of its own device
    index, so an 8-GPU checkpoint resumes on one GPU."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    saved = state.get("cuda")
    if saved is None or not torch.cuda.is_available():
        return
    mine = saved if isinstance(saved, torch.Tensor) else (saved[rank] if rank < len(saved) else None)
    if mine is not None:
        torch.cuda.set_rng_state(mine)   # the current device: the rank's own (trainer.fsdp.init_distributed)


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
    atomic_write_text(path, "".join(line + "\n" for line in keep))


# ----------------------------------------------------------------------------------------------------------
# the training loop's checkpoint: what it saves and what a resumed run reads back
# ----------------------------------------------------------------------------------------------------------
class Resumed(NamedTuple):
    start: int              # the first step to run
    produced_tokens: int    # response tokens of every step so far (Thinking Seeds' token factor)


def save_step(run_dir: Path, step: int, cfg: Config, d: Dist, *, model, tokenizer, optimizer, scheduler, loader,
              builder, produced_tokens: int, protect: Collection[int] = ()) -> None:
    """The checkpoint of ``step`` (collective): sharded model and optimizer by every rank, the Hugging Face export
    and the rank-independent state (scheduler, data cursor, rollout buffers, RNG, token count, config) by rank 0.
    ``protect``: steps retention keeps whatever ``keep_checkpoints`` says (the best checkpoint)."""
    t0 = time.perf_counter()
    state = None
    rng = rng_state(d)   # collective: each rank's own CUDA generator
    if d.is_main:
        state = {"step": step, "scheduler": scheduler.state_dict(), "loader": loader.state_dict(),
                 "rollouts": builder.state_dict(), "rng": rng, "produced_tokens": produced_tokens,
                 "world_size": d.world_size, "config": to_dict(cfg)}
    export = resolve_dtype(cfg.dtype if cfg.export_dtype == "auto" else cfg.export_dtype, d.device)   # auto: compute
    path = save_checkpoint(run_dir, step, model=model, optimizer=optimizer, tokenizer=tokenizer, trainer_state=state,
                           d=d, keep=cfg.keep_checkpoints, keep_resume=cfg.keep_resume_states, export_dtype=export,
                           protect=protect, export_merged=cfg.export_merged)
    if d.is_main and not cfg.progress:
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        print(f"checkpoint {path.name}: {size / 1e6:.1f} MB in {time.perf_counter() - t0:.2f} s", file=sys.stderr)


def resume_run(run_dir: Path, cfg: Config, d: Dist, *, model, optimizer, scheduler, loader, builder) -> Resumed:
    """Continue from the checkpoint ``cfg.resume`` names (auto: this run's newest; rank 0 decides, every rank
    checks): each rank reads its own shards of model and optimizer (any world size wrote them, nothing gathered),
    then the scheduler, data cursor, rollout buffers and RNG; rank 0 drops the metrics logged after it. A fresh
    run starts at step 0."""
    if d.is_main:
        remove_partial_saves(run_dir)
    path = agree_resume_checkpoint(run_dir, cfg.resume, d)
    if path is None:   # from step 0: what an earlier start logged (a run stopped before its first checkpoint) goes
        metrics = run_dir / "metrics.jsonl"
        if d.is_main and metrics.is_file() and metrics.read_text().strip():
            lines = len(metrics.read_text().splitlines())
            truncate_metrics(metrics, -(2 ** 31))
            print(f"starting at step 0: the {lines} metric line(s) an earlier start logged in {metrics} are "
                  f"replaced (no checkpoint to resume from)", file=sys.stderr)
        return Resumed(0, 0)
    state = load_checkpoint(path, model=model, optimizer=optimizer, d=d)
    scheduler.load_state_dict(state["scheduler"])
    loader.load_state_dict(state["loader"])
    builder.load_state_dict(state["rollouts"])
    set_rng_state(state["rng"], rank=d.rank)
    if d.is_main:
        truncate_metrics(run_dir / "metrics.jsonl", state["step"])
        print(f"resumed from {path} at step {state['step'] + 1} (saved on {state['world_size']} ranks, resumed on "
              f"{d.world_size})", file=sys.stderr)
    return Resumed(state["step"] + 1, state["produced_tokens"])

"""Seeds from a mixture of past policies (``seed_source=mixture``; docs/method.md "Seeds from a mixture of past
policies"). The paper leaves the choice of seed sources to future work (§7); this is one: seeds written by the
checkpoints t, t - T, t - 2T, ... and not only the newest.

At each refresh step s the trainer snapshots the current policy θ_s into a ring of the newest K
(``seed_mixture_size``): θ_s, θ_{s-T}, ..., θ_{s-(K-1)T}; with ``seed_mixture_base`` the initial policy θ_0 stays a
member for good. A snapshot is the trainable tensors, on CPU in the master dtype: the adapter with LoRA
(megabytes), every parameter with full fine-tuning (4 B/param in fp32: 28 GB per snapshot at 7B, each rank its own
shard; ``host_bytes``, ``check_host_memory``). The snapshot of θ_s is also what the refresh restores the weights
from, exactly (same dtype, a copy), after a past member wrote its seeds.

Batch 0 of the cycle is trained at step s as on-policy rows (r = π_θ / π_old), so θ_s writes it. Each prompt of
batches 1 .. T-1 draws one member (``draw_members``, seeded by the run's seed and the step: a resumed run draws the
same), which writes all G of its responses and gives their behavior log-probs (the weights are swapped in for the
generation and the behavior forward alike). Per prompt, not per row or per batch: a group's G seeds are then i.i.d.
from one π_b, as Thinking Seeds' are (Lemma 4), the fresh value V_fresh(q) the seed lift compares with is that one
policy's, so the lift binned by the writer's age is clean; and, unlike one member per batch, every seeded step mixes
ages, so the age is not confounded with the step. Prompts are grouped by member, so a refresh swaps weights at most
once per member (and once back), never per prompt.

Member weights (``member_weights``): ``uniform``; ``age``, a list of weights by age, newest first (the base's last);
``relay``, from a relay matrix (``tsanalysis relay --matrix``: the gain of continuing an older checkpoint's prefix
with a newer one, per lag, ``relay_weights``). Members not there yet (the first K - 1 refreshes) are left out and
the others renormalised.

The weight functions are pure (numpy; a DataFrame in); the snapshot functions move tensors.
"""

from __future__ import annotations

import os
import sys
import typing
from pathlib import Path
from typing import Literal, Sequence, TypedDict

import numpy as np
import torch

from contracts.config import ConfigError

__all__ = ["MixtureWeights", "MIXTURE_WEIGHTS", "MATRIX_COLUMNS", "Snapshot", "relay_weights", "member_weights",
           "draw_members", "read_relay_matrix", "take_snapshot", "load_snapshot", "host_bytes", "check_host_memory"]

MixtureWeights = Literal["uniform", "age", "relay"]   # the config's `seed_mixture_weights`
MIXTURE_WEIGHTS = typing.get_args(MixtureWeights)
# what relay_weights reads of `tsanalysis relay --matrix`'s matrix.csv (it has relay, alone, gain_low, ... besides)
MATRIX_COLUMNS = ("writer", "continuer", "k", "gain")
HOST_SHARE = 0.5   # snapshots may take at most this share of the machine's memory (check_host_memory)


class Snapshot(TypedDict):
    step: int                          # the step whose policy this is (the seed_step of what it writes)
    tensors: dict[str, torch.Tensor]   # trainable parameter name -> this rank's values, CPU, master dtype


# --- pure: weights and draws ------------------------------------------------------------------------------
def relay_weights(matrix, ages: Sequence[int], *, floor: float, k: int | None = None) -> np.ndarray:
    """Weights of members ``ages`` steps old, from a relay matrix: w ∝ max(ḡ(lag), 0) + floor, normalised.

    ``matrix``: a DataFrame with columns writer, continuer (checkpoint steps), k and gain (relay pass@k minus the
    continuer's own; ``tsanalysis relay --matrix``). ḡ(lag) is the mean gain over the pairs with continuer - writer
    = lag at pass@``k`` (None: the smallest k in the table, pass@1 where measured: one continuation per seed). A
    member's age uses the nearest measured lag (ties: the shorter); an age of 0 (the policy continuing its own
    prefix, whose relay is its own distribution) has gain 0 unless the matrix measured lag 0. ``floor`` > 0 keeps
    every member drawable and makes the weights uniform where no lag gains."""
    assert floor > 0, f"floor must be > 0 (every member keeps a chance), got {floor}"
    d = matrix[matrix["k"] == (int(matrix["k"].min()) if k is None else k)]
    assert len(d), f"the relay matrix has no rows at k={k}"
    lag = (d["continuer"] - d["writer"]).to_numpy(np.int64)
    lags = np.unique(lag)
    gains = np.array([d["gain"].to_numpy(float)[lag == x].mean() for x in lags])
    out = []
    for age in ages:
        if age == 0 and 0 not in lags:
            out.append(0.0)
            continue
        i = int(np.argmin(np.abs(lags - age)))   # argmin takes the first of equals: lags ascend, so the shorter
        out.append(float(gains[i]))
    w = np.maximum(np.array(out, dtype=np.float64), 0.0) + floor
    return w / w.sum()


def member_weights(ages: Sequence[int], *, base: Sequence[bool], mode: str, by_age: Sequence[float] = (),
                   size: int, matrix=None, floor: float = 0.01) -> np.ndarray:
    """Draw probabilities of the mixture's members, newest first: ``ages`` (steps since each member's policy),
    ``base`` (True for the kept initial policy, last). ``uniform``: equal; ``age``: ``by_age[i]`` for ring member
    i and ``by_age[size]`` for the base (the list has ``size`` entries, one more with a base), renormalised over
    the members present; ``relay``: ``relay_weights(matrix, ages, floor=floor)``."""
    n = len(ages)
    assert n >= 1 and len(base) == n, f"{n} members, {len(base)} base flags"
    if mode == "uniform":
        w = np.ones(n)
    elif mode == "age":
        w = np.array([by_age[size] if b else by_age[i] for i, b in enumerate(base)], dtype=np.float64)
    elif mode == "relay":
        w = relay_weights(matrix, ages, floor=floor)
    else:
        raise AssertionError(f"unknown mixture weights {mode!r}")
    assert (w >= 0).all() and w.sum() > 0, f"mixture weights {w.tolist()} must be >= 0 with a positive sum"
    return w / w.sum()


def draw_members(weights: np.ndarray, n: int, *, seed: int) -> np.ndarray:
    """``n`` member indices drawn i.i.d. from ``weights`` with a generator of its own (every rank, and a resumed
    run, draws the same)."""
    return np.random.default_rng(seed).choice(len(weights), size=n, p=weights)


def read_relay_matrix(path: str | os.PathLike):
    """``tsanalysis relay --matrix``'s matrix.csv as a DataFrame; a ConfigError naming the file when it is not
    there or lacks the columns ``relay_weights`` reads."""
    import pandas as pd

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"seed_mixture_matrix={path}: no such file; write it with `tsanalysis relay --matrix` "
                          f"(matrix.csv), or use seed_mixture_weights=uniform | age")
    try:
        df = pd.read_csv(p)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"seed_mixture_matrix={path}: not a readable CSV ({exc})") from None
    missing = [c for c in MATRIX_COLUMNS if c not in df.columns]
    if missing or df.empty:
        raise ConfigError(f"seed_mixture_matrix={path}: " + (f"no column {', '.join(missing)}" if missing else
                          "no rows") + f" (it needs {', '.join(MATRIX_COLUMNS)}: `tsanalysis relay --matrix` "
                          f"writes them)")
    return df


# --- snapshots --------------------------------------------------------------------------------------------
def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's values of a parameter: the local shard of an FSDP2 DTensor, the tensor itself otherwise."""
    return t.to_local() if hasattr(t, "to_local") else t


def _trainable(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """What the optimizer moves: the adapter's tensors with LoRA, every parameter with full fine-tuning (frozen
    tensors and buffers never change, so a snapshot leaves them out)."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def take_snapshot(model: torch.nn.Module, step: int) -> Snapshot:
    """The trainable tensors of ``model`` now, copied to CPU in their own dtype (the master dtype)."""
    with torch.no_grad():
        return {"step": int(step),
                "tensors": {n: _local(p.detach()).to("cpu", copy=True) for n, p in _trainable(model)}}


def load_snapshot(model: torch.nn.Module, snap: Snapshot) -> None:
    """Copy ``snap``'s tensors into ``model``'s parameters in place (same dtype: bit for bit). The engine sees them
    after a sync (``trainer.rollout.sync_rollout_weights``; the one-process HF engine shares the module)."""
    params = dict(_trainable(model))
    assert params.keys() == snap["tensors"].keys(), "the snapshot holds other parameters than the model trains"
    with torch.no_grad():
        for n, p in params.items():
            _local(p.data).copy_(snap["tensors"][n])


def host_bytes(model: torch.nn.Module) -> int:
    """Bytes of one snapshot on this rank (its shard of every trainable tensor, in its dtype)."""
    return sum(_local(p.detach()).numel() * p.element_size() for _, p in _trainable(model))


def check_host_memory(model: torch.nn.Module, *, members: int, local_ranks: int, main: bool, saved: bool) -> None:
    """Say what the mixture's snapshots cost on this machine (``members`` snapshots per rank, ``local_ranks`` ranks
    on it, ``saved``: whether checkpoints hold them, one process), and refuse (ConfigError, before the first step)
    when they would take more than ``HOST_SHARE`` of its memory: a 7B model fully fine-tuned in fp32 holds 28 GB
    per snapshot."""
    per = host_bytes(model)
    total = per * members * local_ranks
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):   # not a POSIX sysconf: nothing to compare with
        ram = 0
    if ram and total > HOST_SHARE * ram:
        raise ConfigError(f"seed_source=mixture keeps {members} snapshots of {per / 1e9:.2f} GB per rank "
                          f"({total / 1e9:.1f} GB on this machine, {ram / 1e9:.0f} GB of memory): train LoRA "
                          f"adapters (lora_rank > 0: a snapshot is the adapter), or lower seed_mixture_size")
    if main:
        print(f"seed mixture: {members} snapshots of the trainable tensors on CPU, {per / 1e6:.1f} MB each per rank "
              f"({total / 1e9:.2f} GB on this machine), " + ("saved in each checkpoint's trainer_state" if saved else
              "kept per rank and not saved: a resume starts the mixture afresh"), file=sys.stderr)

"""The rollout-engine interface every engine implements, and the argument rules they share.

A prompt is a list of token ids; it may already hold a prefix of an earlier response (a Thinking Seeds *seed*,
docs/method.md). ``generate`` returns one ``Completion`` per prompt (callers repeat a prompt G times for G samples).
The whole prompt is prefilled in one forward pass (never decoded token by token), so a long seed costs one
prefill, like a prompt.

Randomness: ``seeds`` gives every prompt row its own sampling seed, and then a row's completion depends only on its
prompt, its seed and the model (never on the rows it shares a call with, its position in the list, the engine's
batching or how many ranks split the list): an N-rank trainer samples the rows a 1-rank one samples. ``seed``
alone seeds the call as a whole (each engine derives the rows' draws from it and their positions in the call);
neither: fresh randomness.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Sequence

import numpy as np

from contracts.sampling import TOP_K_OFF, resolve_top_k   # re-exported: the engines' argument checks

if TYPE_CHECKING:   # an annotation only: the argument rules (top-k, seeds) load without torch (eval.inputs)
    import torch

__all__ = ["SEED_LIMIT", "TOP_K_OFF", "Completion", "Sampler", "check_generate_args", "prompt_budgets", "resolve_top_k"]


@dataclass
class Completion:
    token_ids: list[int]  # generated ids; ends with an EOS id when finish_reason == "stop", nothing after it
    finish_reason: str  # "stop" (an EOS id was generated) | "length" (max_new_tokens reached)
    # with generate(..., logprobs=True): per generated token, log pi(token) and the entropy (nats) of the
    # distribution it was drawn from, both at the sampling temperature before top-k and top-p (what the trainer
    # computes)
    logprobs: list[float] | None = None
    entropies: list[float] | None = None


class Sampler(Protocol):
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int],  # one budget for all prompts, or one per prompt
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,  # keep the k most likely tokens before top-p (0 or -1: off; ``resolve_top_k``)
        seed: int | None = None,  # one seed for the call (unused when ``seeds`` is given)
        logprobs: bool = False,  # also return each token's log-prob and entropy (engines that can)
        prefix_lens: Sequence[int] | None = None,  # leading tokens of each prompt that other rows share (a hint)
        seeds: Sequence[int] | None = None,  # one seed per prompt, in [0, 2**63): each row's own random stream
    ) -> list[Completion]: ...

    def update_weights(self, model: torch.nn.Module) -> None: ...


def prompt_budgets(prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int]) -> list[int]:
    """Per-prompt generation budgets (a seeded continuation may only fill what its seed left)."""
    if isinstance(max_new_tokens, int):
        return [max_new_tokens] * len(prompts)
    out = [int(m) for m in max_new_tokens]
    if len(out) != len(prompts):
        raise ValueError(f"max_new_tokens has {len(out)} budgets for {len(prompts)} prompts")
    return out


SEED_LIMIT = 2**63   # per-prompt seeds are non-negative and fit a signed 64-bit integer (vLLM, torch)
# top-k off: vLLM's convention (``SamplingParams.top_k``: "0 (or -1) to consider all tokens"; vLLM 0.32 prefers 0
# and quietly accepts -1, its older default) and transformers' (``top_k=0`` adds no TopKLogitsWarper). Both spellings
# are accepted; 0 is what is recorded, so a file written with -1 and one written with 0 are the same setting.
def check_generate_args(prompts: Sequence[Sequence[int]], max_new_tokens, temperature: float, top_p: float,
                        seeds: Sequence[int] | None = None, top_k: int = TOP_K_OFF):
    if seeds is not None:
        if len(seeds) != len(prompts):
            raise ValueError(f"seeds has {len(seeds)} entries for {len(prompts)} prompts; give one seed per prompt")
        for i, s in enumerate(seeds):
            if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or not 0 <= int(s) < SEED_LIMIT:
                raise ValueError(f"seeds[{i}] = {s!r}: each seed must be an integer in [0, 2**63)")
    if min(prompt_budgets(prompts, max_new_tokens), default=0) < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    resolve_top_k(top_k)
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token (e.g. BOS)")

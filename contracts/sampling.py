"""Sampling settings every engine and every scorer read the same way (no torch).

``top_k``: an integer >= 1 keeps the k most likely tokens; ``TOP_K_OFF`` (0) keeps every token. -1 means off too
(vLLM accepts both and prefers 0; transformers uses 0), so ``resolve_top_k`` records both spellings as 0 and a
results file written with -1 resumes one written with 0.
"""

from __future__ import annotations

import numpy as np

__all__ = ["TOP_K_OFF", "resolve_top_k"]

TOP_K_OFF = 0


def resolve_top_k(top_k) -> int:
    """``top_k`` as the engines take it: an integer >= 1 (keep the k most likely tokens), or ``TOP_K_OFF`` for 0 and
    -1 (every token); ValueError for anything else."""
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or int(top_k) < -1:
        raise ValueError(f"top_k must be an integer >= 1, or 0 (or -1) for off; got {top_k!r}")
    return TOP_K_OFF if int(top_k) in (0, -1) else int(top_k)

"""Per-token estimators of KL(π_θ ‖ π_ref) from the sampled tokens' log-probs: the penalty to a reference policy.

With x = log π_θ(o_t|·) − log π_ref(o_t|·) on a token o_t ~ π_θ, J. Schulman, "Approximating KL divergence"
(2020 blog post) gives three estimators of KL(π_θ ‖ π_ref) = E_{o~π_θ}[x]:

    k1 = x                      unbiased, high variance, negative on some tokens
    k2 = x² / 2                 biased, low variance, ≥ 0
    k3 = e^{−x} + x − 1         unbiased (E_{π_θ}[e^{−x}] = 1), low variance, ≥ 0

verl's ``kl_penalty`` (``verl/trainer/ppo/core_algos.py``, the ``kl_loss_type`` of ``use_kl_loss``) names them
``k1``/``kl``, ``k2``/``mse`` and ``k3``/``low_var_kl``, and computes k3 with −x clamped to [−20, 20] before the
exponential and the result clamped to [−10, 10]: so do we (both names, as there). The clamps bind only
where the two policies are far apart (|x| > 20, or k3 > 10, from x ≈ −2.6 down), where k3's gradient is then 0.

As a loss on tokens sampled from π_θ, k2 and k3 pull each token's log-prob toward the reference's (their
gradient in x is x and 1 − e^{−x}: the sign of x); k1's gradient is 1 on every token, whatever x (its value
estimates the KL, its gradient only lowers the sampled tokens' log-probs).

Pure: torch only, the estimator a keyword argument; the trainer reduces the result with ``reduce_loss`` over the
step's denominator (``trainer/update.py``).
"""

from __future__ import annotations

import typing
from typing import Literal

import torch
from torch import Tensor

KlEstimator = Literal["k1", "k2", "k3", "low_var_kl"]   # the config's `kl_estimator`
KL_ESTIMATORS = typing.get_args(KlEstimator)

K3_LOG_RATIO_CLAMP = 20.0   # verl: clamp(ref − logp, −20, 20) before exp
K3_CLAMP = 10.0             # verl: clamp(k3, −10, 10)


def kl_penalty(
    logp: Tensor,  # [N, T] log π_θ of the sampled tokens (may require grad)
    ref_logp: Tensor,  # [N, T] log π_ref of the same tokens (no grad)
    *,
    estimator: str,
) -> Tensor:  # [N, T] per-token KL estimate
    """The per-token estimate of KL(π_θ ‖ π_ref) (module docstring: k1, k2, k3 = low_var_kl as verl clamps it).
    Positions outside the response are computed like any other; the caller masks them in ``reduce_loss``."""
    assert logp.shape == ref_logp.shape, f"logp {tuple(logp.shape)} vs ref_logp {tuple(ref_logp.shape)}"
    if estimator == "k1":
        return logp - ref_logp
    if estimator == "k2":
        return 0.5 * (logp - ref_logp).square()
    if estimator in ("k3", "low_var_kl"):
        neg_x = (ref_logp - logp).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)   # −x = log(π_ref / π_θ)
        return (torch.exp(neg_x) - neg_x - 1.0).clamp(-K3_CLAMP, K3_CLAMP)
    raise ValueError(f"unknown kl_estimator {estimator!r}; choose one of {', '.join(KL_ESTIMATORS)}")

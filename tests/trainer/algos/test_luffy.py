"""LUFFY mixed-policy loss: shaped off-policy values and gradients vs hand values."""

import math

import pytest
import torch

from trainer.algos import luffy_policy_loss

GAMMA = 0.1


def test_luffy_hand_values_and_gradients():
    # row 0 on-policy, A = −1: π_θ = 0.6, π_old = 0.5 -> r = 1.2, ℓ = −A·r = 1.2 (unclipped), dℓ/dlogp = −A·r = 1.2
    # row 1 off-policy, A = 2: π = 0.5 -> f = 0.5/0.6 = 0.8333, ℓ = −2·0.8333 = −1.6667,
    #        dℓ/dlogp = −A·γπ/(π+γ)² = −2·0.05/0.36 = −0.27778
    # row 2 off-policy, A = 1: π = 1e−6 -> f ≈ 1e−5 (9.9999e−6), dℓ/dlogp = −0.1·1e−6/(0.1+1e−6)² ≈ −9.9998e−6
    pi = torch.tensor([[0.6], [0.5], [1e-6]], dtype=torch.float64)
    logp = pi.log().requires_grad_(True)
    old = torch.tensor([[math.log(0.5)], [float("nan")], [float("nan")]], dtype=torch.float64)  # unused off-policy
    adv = torch.tensor([-1.0, 2.0, 1.0], dtype=torch.float64)
    off = torch.tensor([False, True, True])
    loss, stats = luffy_policy_loss(logp, old, adv, off, gamma=GAMMA)
    f = lambda p: p / (p + GAMMA)  # noqa: E731
    want = torch.tensor([[1.2], [-2 * f(0.5)], [-f(1e-6)]], dtype=torch.float64)
    torch.testing.assert_close(loss, want)
    loss.sum().backward()
    dfdlogp = lambda p: GAMMA * p / (p + GAMMA) ** 2  # noqa: E731
    want_grad = torch.tensor([[1.2], [-2 * dfdlogp(0.5)], [-dfdlogp(1e-6)]], dtype=torch.float64)
    torch.testing.assert_close(logp.grad, want_grad)
    assert logp.grad[1, 0].item() == pytest.approx(-0.2777777778, abs=1e-9)
    torch.testing.assert_close(stats["shaped_ratio"], torch.tensor([[1.2], [f(0.5)], [f(1e-6)]], dtype=torch.float64))
    torch.testing.assert_close(stats["ratio"], torch.tensor([[1.2], [0.5], [1e-6]], dtype=torch.float64))
    assert stats["off_policy"].squeeze(1).tolist() == [False, True, True]
    assert not stats["clipped_low"].any() and not stats["clipped_high"].any()


def test_luffy_per_token_off_policy_mask_and_broadcast_agree():
    g = torch.Generator().manual_seed(0)
    logp, old = torch.randn(4, 6, generator=g) - 1, torch.randn(4, 6, generator=g) - 1
    adv = torch.randn(4, generator=g)
    off = torch.tensor([True, False, False, True])
    a, _ = luffy_policy_loss(logp, old, adv, off)
    b, _ = luffy_policy_loss(logp, old, adv.unsqueeze(1).expand(4, 6), off.unsqueeze(1).expand(4, 6))
    torch.testing.assert_close(a, b)
    # on-policy rows are −A·r without any clip, even for r far outside [0.8, 1.28]
    r = (logp - old).exp()
    torch.testing.assert_close(a[1:3], -adv[1:3, None] * r[1:3])

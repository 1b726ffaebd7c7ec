"""M2PO keep-mask vs a loop reference, its defining properties, and the M2PO loss on a hand example; the released
variant's |log r| cap against a restatement of the authors' loop (Infini-AI-Lab/M2PO core_algos.py) and by hand."""

import math

import pytest
import torch

from trainer.algos import loss_denominator, m2po_log_ratio_cap, m2po_mask, m2po_policy_loss, reduce_loss


def _m2po_mask_reference(logp, behavior_logp, adv, mask, tau):
    """Loop version: repeatedly drop the largest-M2 trust-region token (ties: earliest row-major) while mean > tau."""
    n, t = logp.shape
    adv = adv.unsqueeze(1).expand(n, t) if adv.dim() == 1 else adv
    keep = [[bool(mask[i, j]) for j in range(t)] for i in range(n)]
    kept = []  # (flat index, M2) of trust-region tokens still in the loss
    for i in range(n):
        for j in range(t):
            if not mask[i, j]:
                continue
            lr = float(logp[i, j]) - float(behavior_logp[i, j])  # float64, like the vectorised version
            a = float(adv[i, j])
            if (a > 0 and lr > 0) or (a < 0 and lr < 0):
                kept.append((i * t + j, lr * lr))
    while kept and sum(m for _, m in kept) / len(kept) > tau:
        worst = max(range(len(kept)), key=lambda q: (kept[q][1], -kept[q][0]))
        flat, _ = kept.pop(worst)
        keep[flat // t][flat % t] = False
    return torch.tensor(keep, dtype=torch.bool).view(n, t)


def _random_case(seed, discrete):
    g = torch.Generator().manual_seed(seed)
    n, t = int(torch.randint(1, 9, (1,), generator=g)), int(torch.randint(1, 13, (1,), generator=g))
    behavior = torch.randn(n, t, generator=g) - 2.0
    if discrete:  # log r on a grid of 0.05: many exactly tied M2 values
        lr = torch.randint(-8, 9, (n, t), generator=g).float() * 0.05
        logp = behavior + lr
        tau = 0.04 + 3.1e-9  # a mean of grid values can equal 0.04 exactly; stay off the tie with tau
    else:
        logp = behavior + torch.randn(n, t, generator=g) * float(torch.rand(1, generator=g)) * 0.6
        tau = float(torch.rand(1, generator=g)) * 0.1
    if seed % 3 == 0:
        adv = torch.randint(-1, 2, (n, t), generator=g).float()  # per-token, zeros included
    else:
        adv = torch.randint(-2, 3, (n,), generator=g).float()
    lengths = torch.randint(0, t + 1, (n,), generator=g)
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    behavior = torch.where(mask, behavior, torch.full_like(behavior, float("nan")))  # NaN padding
    return logp, behavior, adv, mask, tau


@pytest.mark.parametrize("discrete", [False, True])
def test_m2po_mask_matches_loop_reference(discrete):
    n_dropped_total = 0
    for seed in range(150):
        logp, behavior, adv, mask, tau = _random_case(seed, discrete)
        got = m2po_mask(logp, behavior, adv, mask, tau=tau)
        want = _m2po_mask_reference(logp, behavior, adv, mask, tau)
        assert got.dtype == torch.bool and got.shape == mask.shape
        assert torch.equal(got, want), f"seed {seed}"
        n_dropped_total += int((mask & ~got).sum())
    assert n_dropped_total > 50  # the comparison exercised real dropping


def test_m2po_mask_properties():
    for seed in range(100):
        logp, behavior, adv, mask, tau = _random_case(seed, discrete=False)
        keep = m2po_mask(logp, behavior, adv, mask, tau=tau)
        a = adv.unsqueeze(1).expand_as(logp) if adv.dim() == 1 else adv
        lr = (logp.double() - behavior.double()).nan_to_num(0.0)
        m2 = lr * lr
        trust = mask & (((a > 0) & (lr > 0)) | ((a < 0) & (lr < 0)))
        assert not bool((keep & ~mask).any()), "padding is never kept"
        assert bool(keep[mask & ~trust].all()), "masked tokens outside the trust region always stay"
        kept, dropped = m2[trust & keep], m2[trust & ~keep]
        s, k = kept.sum().item(), kept.numel()
        assert k == 0 or s / k <= tau + 1e-12
        # minimal: putting back any single dropped token pushes the mean above tau
        for d in dropped.tolist():
            assert (s + d) / (k + 1) > tau
        # the dropped tokens are the largest M2 values
        if dropped.numel() and kept.numel():
            assert dropped.min() >= kept.max()


def test_m2po_policy_loss_hand_example():
    # A = 1; log r = [0.5, 0.1, −0.3, 0.0]; trust region (A > 0, r > 1): tokens 0, 1 with M2 = 0.25, 0.01
    #   mean 0.13 > 0.04 -> drop token 0; mean 0.01 <= 0.04 -> stop
    #   loss = [0, −e^0.1, −e^−0.3, −1] (no clip); gradient wrt logp = −A·r on kept tokens, 0 on the dropped
    #   reduced over ALL 4 tokens (the denominator counts dropped ones): (−e^0.1 − e^−0.3 − 1) / 4
    behavior = torch.tensor([[-1.0, -1.0, -1.0, -1.0, float("nan")]], dtype=torch.float64)
    logp = (behavior.nan_to_num(-1.0) + torch.tensor([[0.5, 0.1, -0.3, 0.0, 0.0]], dtype=torch.float64))
    logp.requires_grad_(True)
    mask = torch.tensor([[True, True, True, True, False]])
    loss, stats = m2po_policy_loss(logp, behavior, torch.tensor([1.0], dtype=torch.float64), mask, tau=0.04)
    want = torch.tensor([[0.0, -math.exp(0.1), -math.exp(-0.3), -1.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(loss, want)
    assert stats["m2po_kept"].tolist() == [[False, True, True, True, False]]
    assert stats["m2po_dropped"].tolist() == [[True, False, False, False, False]]
    assert int(stats["m2po_masked"]) == 1 and float(stats["m2po_masked_frac"]) == pytest.approx(0.25)
    assert not stats["clipped_low"].any() and not stats["clipped_high"].any()
    assert loss_denominator(mask, mode="token-mean") == 4.0
    total = reduce_loss(loss, mask, mode="token-mean", denominator=loss_denominator(mask, mode="token-mean"))
    assert total.item() == pytest.approx((-math.exp(0.1) - math.exp(-0.3) - 1.0) / 4, abs=1e-12)
    total.backward()
    torch.testing.assert_close(logp.grad, want / 4)  # d(−A·r)/dlogp = −A·r
    # a precomputed keep-mask is used as given
    loss2, _ = m2po_policy_loss(logp.detach(), behavior, torch.tensor([1.0], dtype=torch.float64), mask,
                                keep=torch.ones_like(mask))
    assert loss2[0, 0].item() == pytest.approx(-math.exp(0.5))


def test_m2po_mask_everything_kept_when_tau_is_large_and_nothing_in_trust_region():
    logp, behavior, adv, mask, _ = _random_case(5, discrete=False)
    assert torch.equal(m2po_mask(logp, behavior, adv, mask, tau=1e9), mask)
    assert torch.equal(m2po_mask(logp, behavior, torch.zeros_like(adv), mask, tau=0.0), mask)


# ---------------------------------------------------------------------------------------------------------
# m2po_variant=released: the authors' code (Infini-AI-Lab/M2PO verl/trainer/ppo/core_algos.py)
# ---------------------------------------------------------------------------------------------------------
def _released_cap_reference(logp, behavior_logp, adv, mask, tau):
    """`kpo_clip_harmful_tokens` + `_solve_tau_from_sorted_delta2` restated as loops over Python floats (without the
    release's 1e-12 nudges): the trust-region tokens' (log r)², sorted; no cap when their mean is within the budget;
    else the first k whose cap at v_k reaches tau·n, and c = sqrt(v_{k−1}) (0 for k = 0)."""
    n, t = logp.shape
    adv = adv.unsqueeze(1).expand(n, t) if adv.dim() == 1 else adv
    v = []
    for i in range(n):
        for j in range(t):
            if not mask[i, j]:
                continue
            lr = float(logp[i, j]) - float(behavior_logp[i, j])
            a = float(adv[i, j])
            if (a > 0 and lr > 0) or (a < 0 and lr < 0):
                v.append(lr * lr)
    v.sort()
    if not v or sum(v) <= tau * len(v):
        return math.inf
    target, left = tau * len(v), 0.0
    for k in range(len(v)):
        left += v[k]
        if v[k] * (len(v) - k - 1) + left >= target:
            return 0.0 if k == 0 else math.sqrt(v[k - 1])
    raise AssertionError("unreachable: capping at the largest value gives the whole sum")


def test_released_cap_matches_the_authors_loop():
    capped = 0
    for seed in range(150):
        logp, behavior, adv, mask, tau = _random_case(seed, discrete=seed % 2 == 0)
        tau = max(tau, 1e-3)
        got = m2po_log_ratio_cap(logp, behavior, adv, mask, tau=tau)
        want = _released_cap_reference(logp, behavior, adv, mask, tau)
        assert got == pytest.approx(want, rel=1e-12) if math.isfinite(want) else math.isinf(got), seed
        capped += math.isfinite(want)
    assert capped > 50   # the comparison exercised real caps


def test_released_cap_and_loss_by_hand():
    # A = 1 everywhere; log r = [0.1, 0.2, 0.3, 0.4, −0.5]: the first four are trust-region tokens (A > 0, r > 1),
    # M2 = v = [0.01, 0.04, 0.09, 0.16], mean 0.075 > τ = 0.04, τ·n = 0.16. Capping at v_k:
    #   k = 0: 0.01 + 3·0.01 = 0.04;  k = 1: 0.05 + 2·0.04 = 0.13;  k = 2: 0.14 + 1·0.09 = 0.23 >= 0.16
    # so c = sqrt(v_1) = 0.2 (capped mean (0.01 + 3·0.04)/4 = 0.0325 <= 0.04; at 0.3 it would be 0.0575).
    # Tokens with |log r| >= 0.2 in the trust region are clipped: ℓ = −e^0.2, gradient 0; the others ℓ = −e^{log r},
    # dℓ/dlogp = −r (the token at −0.5 is outside the trust region: A > 0, r < 1). The paper variant keeps 0.1, 0.2.
    lr = torch.tensor([[0.1, 0.2, 0.3, 0.4, -0.5]], dtype=torch.float64)
    behavior = torch.full_like(lr, -2.0)
    logp = (behavior + lr).requires_grad_(True)
    adv, mask = torch.ones(1, dtype=torch.float64), torch.ones_like(lr, dtype=torch.bool)
    assert m2po_log_ratio_cap(logp, behavior, adv, mask, tau=0.04) == pytest.approx(0.2, rel=1e-12)
    assert m2po_mask(logp, behavior, adv, mask, tau=0.04).tolist() == [[True, True, False, False, True]]
    loss, stats = m2po_policy_loss(logp, behavior, adv, mask, tau=0.04, variant="released")
    e = math.exp
    torch.testing.assert_close(loss, torch.tensor([[-e(0.1), -e(0.2), -e(0.2), -e(0.2), -e(-0.5)]], dtype=torch.float64))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-e(0.1), 0.0, 0.0, 0.0, -e(-0.5)]], dtype=torch.float64))
    assert stats["clipped_high"].tolist() == [[False, True, True, True, False]] and not stats["clipped_low"].any()
    assert stats["m2po_dropped"].tolist() == [[False, True, True, True, False]]
    assert float(stats["m2po_log_ratio_cap"]) == pytest.approx(0.2)
    # negative advantages mirror it: log r = −[0.1 .. 0.4] with A = −1 gives the same cap, ℓ = e^−0.2 past it
    lp2 = (behavior - lr.abs()).requires_grad_(True)
    loss2, st2 = m2po_policy_loss(lp2, behavior, -adv, mask, tau=0.04, variant="released")
    assert st2["clipped_low"].tolist() == [[False, True, True, True, True]]
    assert loss2[0, 1:].tolist() == pytest.approx([e(-0.2)] * 4)
    # within the budget there is no cap: plain −Â·r on every token
    assert m2po_log_ratio_cap(logp, behavior, adv, mask, tau=0.08) == math.inf
    loss3, st3 = m2po_policy_loss(logp.detach(), behavior, adv, mask, tau=0.08, variant="released")
    torch.testing.assert_close(loss3, -lr.exp())
    assert not st3["clipped_high"].any()

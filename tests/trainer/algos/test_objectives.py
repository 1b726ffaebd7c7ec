"""The loss table (trainer.algos.LOSSES) and its reduction: hand-derived values per algorithm, and bit-for-bit
equality (value and gradient) with the formulas the trainer computed inline before the table existed."""

import dataclasses
import math

import pytest
import torch

from trainer.algos import LOSSES, TokenBatch, loss_denominator, loss_mask, m2po_mask, reduce_loss

CLIP = {"clip_low": 0.2, "clip_high": 0.28, "clip_ratio_c": 0.0}


def _one_token(logp, old, adv, **extra):
    """A batch of single-token responses (row i: log π_θ = logp[i], log π_old = old[i], Â = adv[i])."""
    lp = torch.tensor(logp, dtype=torch.float64).unsqueeze(1).requires_grad_(True)
    n = lp.shape[0]
    batch = TokenBatch(logp=lp, old_logp=torch.tensor(old, dtype=torch.float64).unsqueeze(1),
                       adv=torch.tensor(adv, dtype=torch.float64), response_mask=torch.ones(n, 1, dtype=torch.bool),
                       **extra)
    return lp, batch


def test_hand_values_per_algorithm():
    ln = math.log
    # dapo: r = 1.5 with Â = 1 is clipped at 1.28 (no gradient); r = 0.9 with Â = -1 is not:
    # ℓ = 0.9, dℓ/dlogp = 0.9
    lp, b = _one_token([ln(0.75), ln(0.45)], [ln(0.5), ln(0.5)], [1.0, -1.0])
    loss, stats = LOSSES["dapo"](b, **CLIP)
    loss.sum().backward()
    assert loss[:, 0].tolist() == pytest.approx([-1.28, 0.9])
    assert lp.grad[:, 0].tolist() == pytest.approx([0.0, 0.9])
    assert stats["clipped_high"][:, 0].tolist() == [True, False]
    # seeds: a seed token (m = 1) is trained against π_b = 0.25: r = 0.5/0.25 = 2 -> clipped at 1.28; the second
    # row has no seed, so its token is trained against π_old = 0.5: r = 1 -> ℓ = -1
    lp, b = _one_token([ln(0.5), ln(0.5)], [ln(0.5), ln(0.5)], [1.0, 1.0], seed_lens=torch.tensor([1, 0]),
                       behavior_logp=torch.tensor([[ln(0.25)], [float("nan")]], dtype=torch.float64))
    loss, stats = LOSSES["seeds"](b, **CLIP)
    assert loss[:, 0].tolist() == pytest.approx([-1.28, -1.0])
    assert stats["ratio"][:, 0].tolist() == pytest.approx([2, 1])
    # seeds with stale_loss=m2po: the seed token takes -Â·π_θ/π_b = -2 (kept) or 0 (dropped), no clip
    for keep, want in ((True, -2.0), (False, 0.0)):
        kb = dataclasses.replace(b, keep=torch.tensor([[keep], [False]]))
        loss, _ = LOSSES["seeds"](kb, **CLIP, stale_loss="m2po", tau=0.04)
        assert loss[:, 0].tolist() == pytest.approx([want, -1.0])
    # luffy: on-policy r = 0.6/0.5 = 1.2, unclipped: ℓ = -1.2 (Â = 1); off-policy f(π) = 0.3/(0.3 + 0.1) = 0.75,
    # with Â = -2: ℓ = 1.5 and dℓ/dlogp = -Â·γπ/(π+γ)² = 2·0.1·0.3/0.16 = 0.375
    lp, b = _one_token([ln(0.6), ln(0.3)], [ln(0.5), float("nan")], [1.0, -2.0],
                       off_policy=torch.tensor([False, True]))
    loss, _ = LOSSES["luffy"](b, gamma=0.1)
    loss.sum().backward()
    assert loss[:, 0].tolist() == pytest.approx([-1.2, 1.5])
    assert lp.grad[:, 0].tolist() == pytest.approx([-1.2, 0.375])
    # m2po: r = π_θ/π_behavior; both tokens are in the trust region (Â > 0, r > 1) with M2 = ln(1.1)² ≈ 0.0091
    # and ln(2)² ≈ 0.48: the mean 0.24 > τ = 0.04 drops the second; ℓ = [-1.1, 0], no clip
    lp, b = _one_token([ln(0.55), ln(0.8)], [0.0, 0.0], [1.0, 1.0],
                       behavior_logp=torch.tensor([[ln(0.5)], [ln(0.4)]], dtype=torch.float64))
    loss, _ = LOSSES["m2po"](b, tau=0.04)
    assert loss[:, 0].tolist() == pytest.approx([-1.1, 0.0])


def test_the_dual_clip_on_stale_seed_tokens_by_hand():
    """verl's dual clip (clip_ratio_c, its DAPO recipe's 10) on Thinking Seeds' seed tokens, whose r = π_θ / π_b.
    Â = −0.5 on every row, π_θ = 0.6:
      row 0  seed token, π_b = 0.05: r = 12;  clipped loss −Â·max(r, 0.8) = 6 > −Â·c = 5 -> ℓ = 5, gradient 0
      row 1  seed token, π_b = 0.1:  r = 6;   ℓ = 3 (below the cap), dℓ/dlog π = −Â·r = 3
      row 2  no seed (continuation, r = π_θ/π_old = 1): ℓ = 0.5, dℓ/dlog π = 0.5
    Without the dual clip (clip_ratio_c = 0) row 0 keeps ℓ = 6 and its gradient 6; a positive advantage is never
    capped (row 0 with Â = +0.5: clipped high at 1.28, ℓ = −0.64)."""
    ln = math.log
    seeds = dict(seed_lens=torch.tensor([1, 1, 0]),
                 behavior_logp=torch.tensor([[ln(0.05)], [ln(0.1)], [float("nan")]], dtype=torch.float64))
    for c, want_loss, want_grad, dual in ((10.0, [5.0, 3.0, 0.5], [0.0, 3.0, 0.5], [True, False, False]),
                                          (0.0, [6.0, 3.0, 0.5], [6.0, 3.0, 0.5], [False, False, False])):
        lp, b = _one_token([ln(0.6)] * 3, [ln(0.6)] * 3, [-0.5] * 3, **seeds)
        loss, stats = LOSSES["seeds"](b, clip_low=0.2, clip_high=0.28, clip_ratio_c=c)
        loss.sum().backward()
        assert loss[:, 0].tolist() == pytest.approx(want_loss)
        assert lp.grad[:, 0].tolist() == pytest.approx(want_grad)
        assert stats["dual_clipped"][:, 0].tolist() == dual
        assert stats["ratio"][:, 0].tolist() == pytest.approx([12.0, 6.0, 1.0])
    lp, b = _one_token([ln(0.6)], [ln(0.6)], [0.5], seed_lens=torch.tensor([1]),
                       behavior_logp=torch.tensor([[ln(0.05)]], dtype=torch.float64))
    loss, stats = LOSSES["seeds"](b, clip_low=0.2, clip_high=0.28, clip_ratio_c=10.0)
    assert loss[0, 0].item() == pytest.approx(-0.64) and not stats["dual_clipped"].any()


def test_m2po_variants_through_the_table():
    """LOSSES["m2po"] with variant="paper" drops the large-M2 token (ℓ = 0); "released" clips it at e^c instead
    (ℓ = −Â·e^c, gradient 0 in both). r = [1.1, 2] against π_behavior, Â = 1: M2 = [ln(1.1)², ln(2)²], mean 0.245
    > 0.04; the release's cap: k = 1 (0.0091 + 0.48 >= 0.08), c = ln 1.1, so the first token sits at the cap too."""
    ln = math.log
    beh = torch.tensor([[ln(0.5)], [ln(0.4)]], dtype=torch.float64)
    lp, b = _one_token([ln(0.55), ln(0.8)], [0.0, 0.0], [1.0, 1.0], behavior_logp=beh)
    loss, _ = LOSSES["m2po"](b, tau=0.04, variant="paper")
    assert loss[:, 0].tolist() == pytest.approx([-1.1, 0.0])
    lp, b = _one_token([ln(0.55), ln(0.8)], [0.0, 0.0], [1.0, 1.0], behavior_logp=beh)
    loss, stats = LOSSES["m2po"](b, tau=0.04, variant="released")
    loss.sum().backward()
    assert loss[:, 0].tolist() == pytest.approx([-1.1, -1.1])
    assert lp.grad[:, 0].tolist() == pytest.approx([0.0, 0.0])
    assert float(stats["m2po_log_ratio_cap"]) == pytest.approx(ln(1.1))
    # a cap over the whole step (TokenBatch.log_ratio_cap) is used as given: c = ln 2.5 clips neither
    lp, b = _one_token([ln(0.55), ln(0.8)], [0.0, 0.0], [1.0, 1.0], behavior_logp=beh,
                       log_ratio_cap=torch.tensor(ln(2.5)))
    loss, _ = LOSSES["m2po"](b, tau=0.04, variant="released")
    assert loss[:, 0].tolist() == pytest.approx([-1.1, -2.0])


# ---------------------------------------------------------------------------------------------------------
# bit-for-bit equality with the trainer's previous inline formulas (train.py token_losses / loss_normalizer)
# ---------------------------------------------------------------------------------------------------------
def _previous(algorithm, b: TokenBatch, lengths, *, seed_loss, stale_loss, loss_agg, max_len, gamma=0.1):
    """The per-token loss, mask and normaliser as trainer/train.py computed them before the table, restated."""
    from trainer.algos import clipped_policy_loss, luffy_policy_loss, seed_loss_mask, seed_old_logp
    from trainer.algos.losses import _check_mode
    logp, old_logp, adv, resp_mask, keep = b.logp, b.old_logp, b.adv, b.response_mask, b.keep
    R = logp.shape[1]
    behavior, seed_lens, mask = b.behavior_logp, b.seed_lens, resp_mask.clone()
    if algorithm == "luffy":
        loss, _ = luffy_policy_loss(logp, old_logp, adv, b.off_policy, gamma=gamma)
    elif algorithm == "m2po":
        loss = -adv.unsqueeze(1) * torch.exp(logp - behavior.nan_to_num(0.0)) * keep.float()
    else:
        denom = old_logp
        if algorithm == "seeds":
            behavior = behavior.nan_to_num(0.0)
            mask = seed_loss_mask(resp_mask, seed_lens, variant=seed_loss)
            denom = seed_old_logp(old_logp, behavior, seed_lens)
        loss, _ = clipped_policy_loss(logp, denom, adv, **CLIP)
        if algorithm == "seeds" and stale_loss == "m2po":
            seed_tok = (torch.arange(R).unsqueeze(0) < seed_lens.unsqueeze(1)) & resp_mask
            m2 = -adv.unsqueeze(1) * torch.exp(logp - behavior) * keep.float()
            loss = torch.where(seed_tok, m2, loss)
    if loss_agg == "token-sum-norm":
        norm = float(len(lengths) * max_len)
    elif loss_agg.startswith("seq-mean"):
        norm = float(len(lengths))
    elif algorithm == "seeds" and seed_loss == "state":
        norm = float(sum(L - m for L, m in zip(lengths, seed_lens.tolist())))
    else:
        norm = float(sum(lengths))
    norm = torch.tensor(max(norm, 1.0))
    mode = "token-mean" if loss_agg == "token-sum-norm" else loss_agg
    _check_mode(mode)
    masked = torch.where(mask, loss, torch.zeros((), dtype=loss.dtype))
    if mode == "token-mean":
        return masked.sum() / norm
    per_seq = masked.sum(-1)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / mask.sum(-1).clamp(min=1)
    return per_seq.sum() / norm


def _random_batch(algorithm, seed, *, n=6, t=7):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    resp = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    old = torch.randn(n, t, generator=g) * 0.5 - 2.0
    logp = (old + torch.randn(n, t, generator=g) * 0.3).requires_grad_(True)
    adv = torch.randn(n, generator=g)
    seed_lens = torch.zeros(n, dtype=torch.long)
    behavior = torch.full((n, t), float("nan"))
    if algorithm == "seeds":
        seed_lens = (torch.rand(n, generator=g) * lengths).long()
        seed_lens[0] = 0  # a row without a seed (the first batch of a refresh cycle)
        beh = old + torch.randn(n, t, generator=g) * 0.4
        behavior = torch.where(torch.arange(t).unsqueeze(0) < seed_lens.unsqueeze(1), beh, behavior)
    if algorithm == "m2po":
        behavior = torch.where(resp, old + torch.randn(n, t, generator=g) * 0.4, behavior)
    valid = resp & ~torch.isnan(behavior)
    keep = m2po_mask(logp.detach(), behavior.nan_to_num(0.0), adv, valid, tau=0.04)
    return TokenBatch(logp=logp, old_logp=old, adv=adv, response_mask=resp, seed_lens=seed_lens,
                      behavior_logp=behavior, off_policy=torch.rand(n, generator=g) < 0.3, keep=keep), lengths.tolist()


CASES = [("dapo", "state+action", "clip"), ("seeds", "state+action", "clip"), ("seeds", "state", "clip"),
         ("seeds", "state+action", "m2po"), ("seeds", "state", "m2po"), ("luffy", "state+action", "clip"),
         ("m2po", "state+action", "clip")]


@pytest.mark.parametrize("algorithm, seed_loss, stale_loss", CASES)
@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "token-sum-norm"])
def test_table_and_reduction_equal_the_previous_trainer_formulas_bit_for_bit(algorithm, seed_loss, stale_loss,
                                                                               loss_agg):
    hyper = {"dapo": CLIP, "seeds": {**CLIP, "stale_loss": stale_loss, "tau": 0.04}, "luffy": {"gamma": 0.1},
             "m2po": {"tau": 0.04}}[algorithm]
    for seed in range(5):
        b, lengths = _random_batch(algorithm, seed)
        want = _previous(algorithm, b, lengths, seed_loss=seed_loss, stale_loss=stale_loss, loss_agg=loss_agg,
                         max_len=8)
        (want_grad,) = torch.autograd.grad(want, b.logp)
        mask = loss_mask(b.response_mask, b.seed_lens, seed_loss=seed_loss)
        loss_mat, _ = LOSSES[algorithm](b, **hyper)
        got = reduce_loss(loss_mat, mask, mode=loss_agg, denominator=loss_denominator(mask, mode=loss_agg, max_len=8))
        (got_grad,) = torch.autograd.grad(got, b.logp)
        assert torch.equal(got, want), (seed, float(got), float(want))
        assert torch.equal(got_grad, want_grad), seed
        assert want_grad.abs().sum() > 0

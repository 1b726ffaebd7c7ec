"""clipped_policy_loss (hand-derived values and clip stats); loss_denominator and reduce_loss (modes, hand
values, micro-batch invariance)."""

import math

import pytest
import torch

from trainer.algos import AGGREGATE_MODES, clipped_policy_loss, loss_denominator, masked_mean, reduce_loss

# One token per row, old_logp = 0 so r = exp(logp). clip band [0.8, 1.28], dual clip c = 3.
#   row  A    r    −A·r   −A·clip(r)       max    dual (A<0): min(., −A·c)   active clip   d loss / d logp
#   0    1    1.1  −1.1   −1·1.1  = −1.1   −1.1   –                          none          −A·r = −1.1
#   1    2    1.5  −3.0   −2·1.28 = −2.56  −2.56  –                          high          0
#   2   −1    0.5   0.5    1·0.8  =  0.8    0.8   min(0.8, 3) = 0.8          low           0
#   3   −1    5.0   5.0    1·1.28 =  1.28   5.0   min(5, 3)   = 3            dual          0
#   4   −1    1.5   1.5    1·1.28 =  1.28   1.5   1.5                        none          −A·r = 1.5
#   5    1    0.5  −0.5   −1·0.8  = −0.8   −0.5   –                          none          −A·r = −0.5
#   6    0    2.0   0      0                0     0                          none          0
ADV = [1.0, 2.0, -1.0, -1.0, -1.0, 1.0, 0.0]
RATIO = [1.1, 1.5, 0.5, 5.0, 1.5, 0.5, 2.0]
LOSS_NO_DUAL = [-1.1, -2.56, 0.8, 5.0, 1.5, -0.5, 0.0]
LOSS_DUAL = [-1.1, -2.56, 0.8, 3.0, 1.5, -0.5, 0.0]
GRAD_NO_DUAL = [-1.1, 0.0, 0.0, 5.0, 1.5, -0.5, 0.0]
GRAD_DUAL = [-1.1, 0.0, 0.0, 0.0, 1.5, -0.5, 0.0]


def _hand_inputs():
    logp = torch.tensor(RATIO, dtype=torch.float64).log().unsqueeze(1).requires_grad_(True)  # [7, 1]
    return logp, torch.zeros_like(logp), torch.tensor(ADV, dtype=torch.float64)


@pytest.mark.parametrize("clip_ratio_c, want_loss, want_grad", [(0.0, LOSS_NO_DUAL, GRAD_NO_DUAL),
                                                                 (3.0, LOSS_DUAL, GRAD_DUAL)])
def test_clipped_policy_loss_hand_values(clip_ratio_c, want_loss, want_grad):
    logp, old, adv = _hand_inputs()
    loss, stats = clipped_policy_loss(logp, old, adv, clip_low=0.2, clip_high=0.28, clip_ratio_c=clip_ratio_c)
    assert loss.shape == (7, 1)
    torch.testing.assert_close(loss.squeeze(1), torch.tensor(want_loss, dtype=torch.float64))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad.squeeze(1), torch.tensor(want_grad, dtype=torch.float64))
    assert stats["clipped_low"].squeeze(1).tolist() == [False, False, True, False, False, False, False]
    assert stats["clipped_high"].squeeze(1).tolist() == [False, True, False, False, False, False, False]
    assert stats["dual_clipped"].squeeze(1).tolist() == [False, False, False, clip_ratio_c > 0, False, False, False]
    torch.testing.assert_close(stats["ratio"].squeeze(1), torch.tensor(RATIO, dtype=torch.float64))
    assert not stats["ratio"].requires_grad


def test_clipped_policy_loss_per_token_adv_equals_broadcast():
    g = torch.Generator().manual_seed(0)
    logp, old = torch.randn(4, 6, generator=g) * 0.3, torch.randn(4, 6, generator=g) * 0.3
    adv = torch.randn(4, generator=g)
    a, sa = clipped_policy_loss(logp, old, adv)
    b, sb = clipped_policy_loss(logp, old, adv.unsqueeze(1).expand(4, 6))
    torch.testing.assert_close(a, b)
    assert torch.equal(sa["clipped_high"], sb["clipped_high"])
    # default band [1 − 0.2, 1 + 0.28] = [0.8, 1.28]
    r = (logp - old).exp()
    A = adv.unsqueeze(1)
    assert torch.equal(sa["clipped_high"], (A > 0) & (r > 1.28))
    assert torch.equal(sa["clipped_low"], (A < 0) & (r < 0.8))


def test_clipped_policy_loss_extreme_log_ratio_stays_finite():
    logp = torch.tensor([[0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-500.0, 500.0]])  # padding garbage: r would overflow/underflow
    loss, _ = clipped_policy_loss(logp, old, torch.tensor([-1.0]))
    reduce_loss(loss, torch.tensor([[False, False]]), mode="token-mean", denominator=1.0).backward()
    assert torch.isfinite(loss).all() and torch.isfinite(logp.grad).all()


# loss [[1, 2, 3], [4, 5, 6], [7, 8, 9]], mask [[1, 1, 0], [1, 0, 0], [0, 0, 0]] (row 2 empty, NaN masked out)
#   mode                 denominator D                 reduced
#   token-mean           3 loss tokens                 (1 + 2 + 4) / 3             = 7/3
#   seq-mean-token-mean  3 responses (empty counted)   ((1 + 2)/2 + 4/1 + 0) / 3   = 5.5/3
#   seq-mean-token-sum   3 responses                   ((1 + 2) + 4 + 0) / 3       = 7/3
#   token-sum-norm       3 responses · max_len 4       (1 + 2 + 4) / 12            = 7/12
@pytest.mark.parametrize("mode, want_d, want", [("token-mean", 3, 7 / 3), ("seq-mean-token-mean", 3, 5.5 / 3),
                                                ("seq-mean-token-sum", 3, 7 / 3), ("token-sum-norm", 12, 7 / 12)])
def test_reduce_loss_hand_values(mode, want_d, want):
    loss = torch.tensor([[1.0, 2.0, float("nan")], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)
    d = loss_denominator(mask, mode=mode, max_len=4)
    assert d == float(want_d)
    assert reduce_loss(loss, mask, mode=mode, denominator=d).item() == pytest.approx(want, abs=1e-12)
    # the denominator is the caller's: another one scales the result
    assert reduce_loss(loss, mask, mode=mode, denominator=10.0).item() == pytest.approx(want * want_d / 10, abs=1e-12)


def test_unknown_mode_names_valid_modes():
    from trainer.config import LOSS_AGGS
    for fn in (lambda m: reduce_loss(torch.zeros(2, 2), torch.ones(2, 2, dtype=torch.bool), mode=m, denominator=1.0),
               lambda m: loss_denominator(torch.ones(2, 2, dtype=torch.bool), mode=m)):
        with pytest.raises(ValueError, match="token-mean.*seq-mean-token-mean.*seq-mean-token-sum.*token-sum-norm"):
            fn("seq-sum")
    assert AGGREGATE_MODES == ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "token-sum-norm")
    assert AGGREGATE_MODES == LOSS_AGGS  # the config's loss_agg choices are exactly these


def test_empty_mask_gives_zero_loss_over_denominator_one():
    empty = torch.zeros(2, 3, dtype=torch.bool)
    assert loss_denominator(empty, mode="token-mean") == 1.0
    assert reduce_loss(torch.ones(2, 3), empty, mode="token-mean", denominator=1.0).item() == 0.0
    with pytest.raises(AssertionError, match="max_len"):
        loss_denominator(empty, mode="token-sum-norm")


@pytest.mark.parametrize("mode", AGGREGATE_MODES)
@pytest.mark.parametrize("splits", [[5, 7], [3, 5, 4], [1] * 12])
def test_reduce_loss_micro_batch_invariance(mode, splits):
    """Σ over micro-batches of reduce_loss(..., denominator of the whole batch) == full batch, value and gradient."""
    g = torch.Generator().manual_seed(1)
    n, t = 12, 9
    w = torch.randn(n, t, generator=g, dtype=torch.float64, requires_grad=True)
    old = torch.randn(n, t, generator=g, dtype=torch.float64) * 0.2 - 1.0
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    mask[4] = False  # a sequence with no loss tokens (e.g. a "state" variant row with no continuation)

    def loss_mat(rows):
        logp = 0.3 * w[rows] - 1.0
        return clipped_policy_loss(logp, old[rows], adv[rows])[0]

    d = loss_denominator(mask, mode=mode, max_len=t)
    full = reduce_loss(loss_mat(slice(0, n)), mask, mode=mode, denominator=d)
    (grad_full,) = torch.autograd.grad(full, w)

    total, grad_sum, start = 0.0, torch.zeros_like(w), 0
    for size in splits:
        rows = slice(start, start + size)
        part = reduce_loss(loss_mat(rows), mask[rows], mode=mode, denominator=d)
        (gp,) = torch.autograd.grad(part, w)
        total, grad_sum, start = total + part.item(), grad_sum + gp, start + size
    assert start == n
    assert total == pytest.approx(full.item(), abs=1e-6)
    torch.testing.assert_close(grad_sum, grad_full, atol=1e-6, rtol=0)
    assert grad_full.abs().sum() > 0


def test_masked_mean():
    x = torch.tensor([[1.0, 2.0, float("nan")], [3.0, 5.0, 7.0]])
    m = torch.tensor([[True, True, False], [False, True, True]])
    assert masked_mean(x, m).item() == pytest.approx((1 + 2 + 5 + 7) / 4)
    torch.testing.assert_close(masked_mean(x, m, dim=1), torch.tensor([1.5, 6.0]))
    assert masked_mean(x, torch.zeros_like(m)).item() == 0.0
    assert math.isfinite(masked_mean(x, m).item())

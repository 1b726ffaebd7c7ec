"""The KL penalty's estimators (``trainer.algos.kl``) against their closed forms (J. Schulman, "Approximating KL
divergence"), verl's clamps, and the direction of their gradient."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.algos import KL_ESTIMATORS, kl_penalty

LP = torch.tensor([[-1.0, -0.5, -2.0]])    # log pi_theta of three sampled tokens
REF = torch.tensor([[-1.2, -0.5, -1.0]])   # log pi_ref of the same tokens: x = LP - REF = [0.2, 0, -1]


def test_estimators_match_their_closed_forms_by_hand():
    # k1 = x; k2 = x^2 / 2; k3 = e^{-x} + x - 1 (= exp(ref - lp) - (ref - lp) - 1)
    assert kl_penalty(LP, REF, estimator="k1")[0].tolist() == pytest.approx([0.2, 0.0, -1.0], abs=1e-6)
    assert kl_penalty(LP, REF, estimator="k2")[0].tolist() == pytest.approx([0.02, 0.0, 0.5], abs=1e-6)
    k3 = [math.exp(-0.2) + 0.2 - 1, 0.0, math.e - 2]
    assert k3 == pytest.approx([0.0187308, 0.0, 0.7182818], abs=1e-7)
    assert kl_penalty(LP, REF, estimator="k3")[0].tolist() == pytest.approx(k3, abs=1e-6)
    assert torch.equal(kl_penalty(LP, REF, estimator="low_var_kl"), kl_penalty(LP, REF, estimator="k3"))


@pytest.mark.parametrize("estimator", KL_ESTIMATORS)
def test_every_estimator_is_zero_where_the_policy_is_the_reference(estimator):
    lp = torch.randn(4, 7, generator=torch.Generator().manual_seed(0)) - 2
    assert torch.equal(kl_penalty(lp, lp.clone(), estimator=estimator), torch.zeros(4, 7))


def test_k1_and_k3_average_to_the_exact_kl_under_the_policy():
    """Unbiased: sum_v pi(v) k(v) = KL(pi || ref) exactly for k1 and k3 (k2 is biased: 0.0249 here, against 0.0253)."""
    pi = torch.tensor([0.5, 0.3, 0.2])
    ref = torch.tensor([0.4, 0.4, 0.2])
    exact = float((pi * (pi / ref).log()).sum())   # 0.5 ln 1.25 + 0.3 ln 0.75 = 0.0252627
    assert exact == pytest.approx(0.5 * math.log(1.25) + 0.3 * math.log(0.75), abs=1e-7)
    for est in ("k1", "k3"):
        k = kl_penalty(pi.log().unsqueeze(0), ref.log().unsqueeze(0), estimator=est)[0]
        assert float((pi * k).sum()) == pytest.approx(exact, abs=1e-6), est
    k2 = kl_penalty(pi.log().unsqueeze(0), ref.log().unsqueeze(0), estimator="k2")[0]
    assert float((pi * k2).sum()) == pytest.approx(0.5 * (0.5 * math.log(1.25) ** 2 + 0.3 * math.log(0.75) ** 2),
                                                   abs=1e-7)


def test_k3_is_clamped_as_verl_clamps_it():
    """verl's low_var_kl: -x clamped to [-20, 20] before exp (no overflow), the estimate clamped to [-10, 10]: the
    clamp binds from k3 > 10 (x > ~11 or x < ~-2.53) and its gradient is 0 there; below it k3 is the closed form."""
    lp = torch.tensor([[-30.0, -1.0, -3.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[-1.0, -30.0, -1.0, -6.0]])   # -x = 29 (e^29 clamped to e^20), -29, 2, -5
    out = kl_penalty(lp, ref, estimator="k3")
    assert out[0].tolist() == pytest.approx([10.0, 10.0, math.exp(2) - 3, math.exp(-5) + 4], abs=1e-5)  # 4.389, 4.007
    out.sum().backward()
    assert lp.grad[0, :2].tolist() == [0.0, 0.0]
    assert lp.grad[0, 2:].tolist() == pytest.approx([1 - math.exp(2), 1 - math.exp(-5)], abs=1e-5)
    assert torch.isfinite(kl_penalty(torch.tensor([[-1e4]]), torch.tensor([[0.0]]), estimator="k3")).all()


@pytest.mark.parametrize("estimator", ["k2", "k3", "low_var_kl"])
def test_the_kl_term_alone_pulls_log_probs_toward_the_reference(estimator):
    """d k / d lp: k2 -> x, k3 -> 1 - e^{-x}; both the sign of x = lp - ref, so a gradient step on the KL term
    alone moves every log-prob toward the reference's, and repeated steps reach it."""
    lp = LP.clone().requires_grad_(True)
    kl_penalty(lp, REF, estimator=estimator).sum().backward()
    x = (LP - REF)[0]
    want = x if estimator == "k2" else 1 - torch.exp(-x)
    assert lp.grad[0].tolist() == pytest.approx(want.tolist(), abs=1e-6)   # [0.2, 0, -1] / [0.181, 0, -1.718]
    moved = LP - 0.1 * lp.grad
    assert ((moved - REF).abs() <= (LP - REF).abs()).all()
    assert ((moved - REF).abs()[0, [0, 2]] < (LP - REF).abs()[0, [0, 2]]).all()
    p = LP.clone().requires_grad_(True)
    opt = torch.optim.SGD([p], lr=0.3)
    for _ in range(200):
        opt.zero_grad()
        kl_penalty(p, REF, estimator=estimator).sum().backward()
        opt.step()
    assert p.detach()[0].tolist() == pytest.approx(REF[0].tolist(), abs=1e-4)


def test_k1s_gradient_is_one_on_every_token_whatever_the_reference():
    lp = LP.clone().requires_grad_(True)
    kl_penalty(lp, REF, estimator="k1").sum().backward()
    assert lp.grad.tolist() == [[1.0, 1.0, 1.0]]


def test_an_unknown_estimator_is_refused():
    with pytest.raises(ValueError, match="unknown kl_estimator 'k4'; choose one of k1, k2, k3, low_var_kl"):
        kl_penalty(LP, REF, estimator="k4")

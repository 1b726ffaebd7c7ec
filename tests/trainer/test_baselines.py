"""The 2025 exploration baselines: Clip-Cov and KL-Cov (``algorithm=clip_cov | kl_cov``, trainer/algos/cov.py), the
pass@k, grpo_passk and W-REINFORCE advantages (``advantage=``, trainer/algos/advantages.py) and the high-entropy-token
mask (``token_mask=high_entropy``, trainer/algos/high_entropy.py).

* The pure functions against their formulas: hand values (pass@k with N = 4, k = 2: Â = +1 / −1/3; grpo_passk
  2 on the best of [1, 0, 0, 0]; W-REINFORCE +λ / −1; KL-Cov's −Â r + β|log r|), a brute-force enumeration of
  k-subsets for the analytical pass@k advantage, and numpy re-implementations of the covariance, Clip-Cov's draw,
  KL-Cov's top-k and the high-entropy top-⌈ρN⌉.
* The denominator rules: the high-entropy mask's dropped tokens leave the token-mean denominator (the loss is the mean
  over the kept tokens); Clip-Cov's zeroed and KL-Cov's penalised tokens stay in it.
* In the trainer: ``backward_minibatch`` with the masks over the whole mini-batch gives the hand loss and the same
  gradient for every micro-batch size (with Thinking Seeds' state variant and masked IS composed in).
* One tiny run per preset (mini_clip_cov, mini_kl_cov, mini_passk, mini_w_reinforce, mini_high_entropy) logs finite
  metrics, and the advantages it records are the formula's of its rewards; bad values are a ConfigError (one line,
  exit 2 from the CLI).
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.rollouts import fixed_rollouts
from trainer.algos import (ADVANTAGES, LOSSES, TokenBatch, clip_cov_mask, clipped_policy_loss, group_advantages,
                           high_entropy_count, high_entropy_mask, kl_cov_mask, loss_denominator, loss_mask,
                           max_advantages, passk_advantages, reduce_loss, token_covariance, w_reinforce_advantages)
from trainer.config import ConfigError, load_config, loss_kwargs
from trainer.fsdp import Dist
from trainer.train import main
from trainer.update import (_stack, backward_minibatch, cov_masks, entropy_keep_masks, rollout_keep_masks,
                            rows_loss_mask, token_batch)

REPO = Path(__file__).resolve().parents[2]
EPS = 1e-6


# ---------------------------------------------------------------------------------------------- advantages
def test_passk_advantage_by_hand():
    # N = 4, one correct, k = 2: R̄ = 1 − C(3,2)/C(4,2) = 1/2, σ = 1/2; Â_pos = (1/2)/σ = 1,
    # Â_neg = (1 − 1/2 − C(2,1)/C(3,1)) / σ = (1/2 − 2/3) / (1/2) = −1/3
    adv = passk_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.zeros(4, dtype=torch.long), k=2)
    assert adv.tolist() == pytest.approx([0.5 / (0.5 + EPS)] + [(0.5 - 2 / 3) / (0.5 + EPS)] * 3, rel=1e-6)
    assert adv.tolist() == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3], abs=1e-5)


def _passk_by_enumeration(r: list[float], k: int) -> list[float]:
    """Â_i = (E[max R over the k-subsets that hold i] − E[max R over all k-subsets]) / σ, σ = sqrt(R̄(1 − R̄))."""
    subsets = list(itertools.combinations(range(len(r)), k))
    rbar = np.mean([max(r[j] for j in s) for s in subsets])
    sigma = math.sqrt(rbar * (1 - rbar))
    out = []
    for i in range(len(r)):
        mine = [max(r[j] for j in s) for s in subsets if i in s]
        out.append((np.mean(mine) - rbar) / (sigma + EPS))
    return out


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_passk_advantage_is_the_subset_average(k):
    rewards = [1, 0, 0, 1, 0, 0, 0,   0, 0, 0, 0, 0, 0, 1,   1, 1, 1, 1, 1, 1, 1,   0, 1, 1, 1, 1, 0, 1]
    groups = [g for g in range(4) for _ in range(7)]
    adv = passk_advantages(torch.tensor(rewards, dtype=torch.float32), torch.tensor(groups), k=k)
    want = [a for g in range(4) for a in _passk_by_enumeration(rewards[7 * g: 7 * g + 7], k)]
    want = [0.0 if math.isnan(a) else a for a in want]   # all-correct group: σ = 0 and 0/0 -> the reference's 0
    assert adv.tolist() == pytest.approx(want, abs=1e-5)
    assert adv[14:21].abs().max() == 0   # the all-correct group carries nothing
    if k == 1:   # pass@1 is GRPO's advantage with the population std
        pop = [(x - np.mean(rewards[7 * g: 7 * g + 7])) / (np.std(rewards[7 * g: 7 * g + 7]) + EPS)
               for g in range(4) for x in rewards[7 * g: 7 * g + 7]]
        assert adv.tolist() == pytest.approx(pop, abs=1e-5)
    if k == 5:   # group 0 has 5 wrong of 7 and group 3 only 2: N_neg < k gives 0 to everyone in group 3
        assert adv[21:].abs().max() == 0


def test_passk_refuses_small_groups_and_graded_rewards():
    with pytest.raises(ValueError, match="at least k=3 responses per group"):
        passk_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), k=3)
    with pytest.raises(ValueError, match="binary rewards"):
        passk_advantages(torch.tensor([1.0, 0.5]), torch.tensor([0, 0]), k=1)


def test_grpo_passk_gives_the_best_response_max_minus_second():
    r = torch.tensor([0.0, 1.0, 0.0, 0.0,   1.0, 1.0, 0.0, 0.0,   0.2, 0.9, 0.5, 0.9])
    g = torch.tensor([0] * 4 + [1] * 4 + [2] * 4)
    adv = max_advantages(r, g, scale="std")
    std0 = float(np.std([0, 1, 0, 0], ddof=1))   # √(0.75 / 3) = 1/2: torch.std is unbiased, as verl's
    assert adv[:4].tolist() == pytest.approx([0, 1 / (std0 + EPS), 0, 0], rel=1e-6)
    assert adv[1] == pytest.approx(2.0, rel=1e-5)
    assert adv[4:8].abs().max() == 0   # a tie at the top: R_max − R_2nd = 0
    assert adv[8:].abs().max() == 0    # 0.9 twice: also a tie
    assert max_advantages(r[:4], g[:4], scale="none").tolist() == [0.0, 1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="at least 2 responses"):
        max_advantages(torch.tensor([1.0]), torch.tensor([0]))


def test_w_reinforce_weights_positives_by_lambda():
    r, g = torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1])
    assert w_reinforce_advantages(r, g, positive_weight=0.1).tolist() == pytest.approx([0.1, -1.0, 0.1, 0.1])
    assert w_reinforce_advantages(r, g, positive_weight=0.0).tolist() == [0.0, -1.0, 0.0, 0.0]   # NSR alone
    with pytest.raises(ValueError, match="binary rewards"):
        w_reinforce_advantages(torch.tensor([0.5]), torch.tensor([0]))


def test_the_advantage_table_takes_the_config_kwargs():
    from trainer.config import ADVANTAGE_NAMES, adv_kwargs
    assert set(ADVANTAGES) == set(ADVANTAGE_NAMES) == {"grpo", "passk", "grpo_passk", "w_reinforce"}
    r, g = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0]), torch.tensor([0] * 4 + [1] * 4)
    for name in ADVANTAGES:
        adv = ADVANTAGES[name](r, g, **adv_kwargs(load_config(None, [f"advantage={name}"])))
        assert adv.shape == (8,) and torch.isfinite(adv).all(), name
    assert torch.equal(ADVANTAGES["grpo"](r, g, scale="std"), group_advantages(r, g))


# ---------------------------------------------------------------------------------------------- Clip-Cov / KL-Cov
LOGP = torch.tensor([[-0.1, -2.0, -0.5, -3.0, -1.0], [-0.2, -4.0, -1.5, -0.3, -2.5], [-0.7, -0.9, -5.0, -0.4, -1.1]])
ADV = torch.tensor([2.0, -1.5, 0.5])
MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 0, 0]], dtype=torch.bool)


def _np_cov(logp, adv, mask):
    lp, m = logp.numpy().astype(np.float64), mask.numpy()
    a = np.broadcast_to(adv.numpy()[:, None], lp.shape).astype(np.float64)
    return np.where(m, (a - a[m].mean()) * (lp - lp[m].mean()), 0.0)


def test_token_covariance_matches_numpy_and_a_hand_value():
    cov = token_covariance(LOGP, ADV, MASK)
    np.testing.assert_allclose(cov.numpy(), _np_cov(LOGP, ADV, MASK), atol=1e-12)
    # token (1, 1): Â = −1.5, token means over the 12 loss tokens: Â̄ = (5·2 − 4·1.5 + 3·0.5)/12 = 5.5/12,
    # log π̄ = −19.2/12 = −1.6; cov = (−1.5 − 5.5/12)(−4 + 1.6) = 4.7
    assert float(cov[1, 1]) == pytest.approx(4.7, rel=1e-9)
    assert cov[~MASK].abs().max() == 0


def test_clip_cov_draws_only_inside_the_band_and_outside_the_clip():
    cov = _np_cov(LOGP, ADV, MASK)
    lb, ub = 0.5, 5.0
    clipped = torch.zeros_like(MASK)
    clipped[0, 0] = True   # pretend the PPO clip is active there (cov 2.31: it would qualify)
    band = MASK.numpy() & (cov > lb) & (cov < ub) & ~clipped.numpy()
    assert band.sum() == 3 and (MASK.numpy() & (cov > lb) & (cov < ub))[0, 0]   # 1.70, 0.92, 4.70 are left
    for ratio, want in [(2e-4, 1), (0.2, 2), (0.9, int(band.sum()))]:   # max(⌊r·12⌋, 1), at most the candidates
        sel = clip_cov_mask(LOGP, ADV, MASK, ratio=ratio, lb=lb, ub=ub, clipped=clipped,
                            generator=torch.Generator().manual_seed(1))
        assert int(sel.sum()) == min(want, int(band.sum()))
        assert not (sel.numpy() & ~band).any()
    draws = {tuple(clip_cov_mask(LOGP, ADV, MASK, ratio=0.1, lb=lb, ub=ub,
                                 generator=torch.Generator().manual_seed(s)).flatten().tolist()) for s in range(20)}
    assert len(draws) > 1   # a random draw, reproducible from its seed
    assert torch.equal(clip_cov_mask(LOGP, ADV, MASK, ratio=0.1, lb=lb, ub=ub, generator=torch.Generator().manual_seed(3)),
                       clip_cov_mask(LOGP, ADV, MASK, ratio=0.1, lb=lb, ub=ub, generator=torch.Generator().manual_seed(3)))


def test_kl_cov_takes_the_top_covariance_tokens():
    cov = _np_cov(LOGP, ADV, MASK)
    flat = [(cov[i, t], i, t) for i in range(3) for t in range(5) if MASK[i, t]]
    for ratio, k in [(0.002, 1), (0.25, 3), (1.0, 12)]:   # max(⌊12·ratio⌋, 1)
        sel = kl_cov_mask(LOGP, ADV, MASK, ratio=ratio)
        top = sorted(flat, key=lambda x: -x[0])[:k]
        assert sorted(zip(*sel.nonzero(as_tuple=True))) == sorted((i, t) for _, i, t in top)
        assert int(sel.sum()) == k and not (sel & ~MASK).any()


def test_clip_cov_loss_is_dapo_with_the_selected_tokens_zeroed():
    old = LOGP - torch.tensor([[0.05, -0.3, 0.0, 0.4, 0.1], [0.0, 0.2, -0.1, 0.0, 0.0], [0.3, 0.0, 0.0, 0.0, 0.0]])
    logp = LOGP.clone().requires_grad_(True)
    sel = torch.zeros_like(MASK)
    sel[0, 0] = sel[1, 2] = True
    b = TokenBatch(logp=logp, old_logp=old, adv=ADV, response_mask=MASK, cov_selected=sel)
    loss, stats = LOSSES["clip_cov"](b, clip_low=0.2, clip_high=0.28, ratio=2e-4, lb=1.0, ub=5.0)
    dapo, _ = clipped_policy_loss(logp, old, ADV, clip_low=0.2, clip_high=0.28)
    assert torch.equal(loss[~sel], dapo[~sel]) and loss[sel].abs().max() == 0
    assert torch.equal(stats["cov_selected"], sel)
    reduce_loss(loss, MASK, mode="token-mean", denominator=loss_denominator(MASK, mode="token-mean")).backward()
    assert logp.grad[sel].abs().max() == 0 and logp.grad[~sel & MASK].abs().min() >= 0
    # the zeroed tokens stay in the denominator: 12 response tokens, whatever is selected
    assert loss_denominator(MASK, mode="token-mean") == 12.0


def test_kl_cov_loss_by_hand():
    # π_θ = 0.5, π_old = 0.4: r = 1.25, Â = 1, β = 1: −1.25 + |log 1.25| on the selected token, −1.25 elsewhere
    logp = torch.full((1, 2), math.log(0.5), requires_grad=True)
    old = torch.full((1, 2), math.log(0.4))
    b = TokenBatch(logp=logp, old_logp=old, adv=torch.tensor([1.0]), response_mask=torch.ones(1, 2, dtype=torch.bool),
                   cov_selected=torch.tensor([[True, False]]))
    loss, stats = LOSSES["kl_cov"](b, ratio=0.002, kl_coef=1.0)
    assert loss.tolist()[0] == pytest.approx([-1.25 + math.log(1.25), -1.25], rel=1e-6)
    assert not stats["clipped_low"].any() and not stats["clipped_high"].any()   # no ε-clip
    loss.sum().backward()   # d/dlogp: −r + β·sign(log r) on the selected token, −r elsewhere
    assert logp.grad.tolist()[0] == pytest.approx([-1.25 + 1.0, -1.25], rel=1e-6)
    # at r = 1 exactly (π_old = π_θ.detach(): one on-policy update) the penalty has no gradient, as in verl
    lp = torch.full((1, 1), -0.7, requires_grad=True)
    b1 = TokenBatch(logp=lp, old_logp=lp.detach(), adv=torch.tensor([1.0]), response_mask=torch.ones(1, 1, dtype=torch.bool),
                    cov_selected=torch.ones(1, 1, dtype=torch.bool))
    LOSSES["kl_cov"](b1, ratio=0.002, kl_coef=1.0)[0].sum().backward()
    assert lp.grad.item() == pytest.approx(-1.0)


def test_the_cov_losses_select_over_the_batch_without_a_mask():
    b = TokenBatch(logp=LOGP, old_logp=LOGP, adv=ADV, response_mask=MASK)
    _, st = LOSSES["kl_cov"](b, ratio=0.25, kl_coef=1.0)
    assert torch.equal(st["cov_selected"], kl_cov_mask(LOGP, ADV, MASK, ratio=0.25))
    _, st = LOSSES["clip_cov"](b, clip_low=0.2, clip_high=0.28, ratio=0.2, lb=0.5, ub=5.0)
    assert int(st["cov_selected"].sum()) == 2


# ---------------------------------------------------------------------------------------------- high-entropy mask
def test_high_entropy_keeps_the_top_ceil_share():
    assert [high_entropy_count(n, 0.2) for n in (0, 1, 4, 5, 10, 11, 100)] == [0, 1, 1, 1, 2, 3, 20]
    H = torch.tensor([[0.1, 2.0, 0.3, 1.5, 0.2], [3.0, 0.05, 0.4, 9.9, 9.9]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)   # 8 loss tokens; 9.9s are padding
    keep = high_entropy_mask(H, mask, ratio=0.2)   # max(1, int(1.6 + 0.9999)) = 2: H = 3.0 and 2.0
    assert keep.nonzero().tolist() == [[0, 1], [1, 0]]
    keep = high_entropy_mask(H, mask, ratio=0.5)   # 4: 3.0, 2.0, 1.5, 0.4
    assert keep.nonzero().tolist() == [[0, 1], [0, 3], [1, 0], [1, 2]]
    # numpy: the ⌈ρN⌉ largest of the loss tokens' entropies, ties broken by position
    g = torch.Generator().manual_seed(0)
    H = torch.randint(0, 4, (6, 9), generator=g).float()
    mask = torch.rand(6, 9, generator=g) < 0.7
    keep = high_entropy_mask(H, mask, ratio=0.3)
    h, m = H.numpy().ravel(), mask.numpy().ravel()
    idx = np.flatnonzero(m)
    k = max(1, int(len(idx) * 0.3 + 0.9999))
    want = np.zeros_like(m)
    want[idx[np.argsort(-h[idx], kind="stable")[:k]]] = True
    assert (keep.numpy().ravel() == want).all()


def test_masked_low_entropy_tokens_leave_the_denominator():
    # loss 1..4 on four tokens, entropies put tokens 2 and 4 on top (ratio 0.5): token-mean = (2 + 4) / 2
    loss_mat = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    resp = torch.ones(1, 4, dtype=torch.bool)
    keep = high_entropy_mask(torch.tensor([[0.1, 0.9, 0.2, 0.8]]), resp, ratio=0.5)
    m = loss_mask(resp, torch.zeros(1, dtype=torch.long), seed_loss="state+action", entropy_keep=keep)
    D = loss_denominator(m, mode="token-mean")
    assert D == 2.0 and float(reduce_loss(loss_mat, m, mode="token-mean", denominator=D)) == pytest.approx(3.0)
    # composed after Thinking Seeds' state variant: the 2 seed tokens are out first, the mask picks among the rest
    seed = torch.tensor([2])
    base = loss_mask(resp, seed, seed_loss="state")
    keep = high_entropy_mask(torch.tensor([[5.0, 5.0, 0.2, 0.8]]), base, ratio=0.5)
    m = loss_mask(resp, seed, seed_loss="state", entropy_keep=keep)
    assert m.tolist() == [[False, False, False, True]]
    assert float(reduce_loss(loss_mat, m, mode="token-mean", denominator=loss_denominator(m, mode="token-mean"))) == 4.0


# ---------------------------------------------------------------------------------------------- in the trainer
def _setup(algorithm: str, micro_batch_size: int = 64, **over):
    from inference.tiny import build_model, build_tokenizer
    from trainer.policy import score
    tok = build_tokenizer()
    cfg = load_config(None, [f"algorithm={algorithm}", f"micro_batch_size={micro_batch_size}", "train_forward=model",
                             *[f"{k}={v}" for k, v in over.items()]])
    rows = fixed_rollouts(tok, algorithm=algorithm if algorithm == "seeds" else "dapo")
    for i, r in enumerate(rows):
        r.uid = i
    model = build_model("1m", tok, seed=3)
    logp, ent = score(model, [r.prompt_ids for r in rows], [r.response_ids for r in rows], pad_id=tok.pad_token_id,
                      micro_batch_size=64, d=Dist())
    cur = {r.uid: lp.tolist() for r, lp in zip(rows, logp)}
    ent = {r.uid: h.tolist() for r, h in zip(rows, ent)}
    return tok, cfg, rows, model, cur, ent


def _step(algorithm: str, micro_batch_size: int, **over):
    tok, cfg, rows, model, cur, ent = _setup(algorithm, micro_batch_size, **over)
    old = cur if cfg.rollout_correction != "none" else None
    if old is not None:   # mis_token: w = 3 on every third sampled token
        for r in rows:
            r.sampler_logp = [math.nan if t < r.seed_len else lp - (math.log(3.0) if (r.uid + t) % 3 == 0 else 0.0)
                              for t, lp in enumerate(cur[r.uid])]
    ent_kept = entropy_keep_masks(cfg, rows, ent, old)
    cov = cov_masks(cfg, rows, cur, old, ent_kept, draw=7)
    total, records = backward_minibatch(model, cfg, rows, Dist(), pad_id=tok.pad_token_id, old=old,
                                        entropy_kept=ent_kept, cov=cov)
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return tok, cfg, rows, cur, old, ent_kept, cov, total, records, grads


CASES = [("clip_cov", {"clip_cov_ratio": 0.2, "clip_cov_lb": -100.0, "clip_cov_ub": 100.0}),
         ("kl_cov", {"kl_cov_ratio": 0.2}),
         ("dapo", {"token_mask": "high_entropy"}),
         ("seeds", {"token_mask": "high_entropy", "seed_loss": "state", "high_entropy_ratio": 0.3}),
         ("clip_cov", {"token_mask": "high_entropy", "rollout_correction": "mis_token", "clip_cov_ratio": 0.3,
                       "clip_cov_lb": -100.0, "clip_cov_ub": 100.0})]


@pytest.mark.parametrize("algorithm, over", CASES, ids=lambda x: x if isinstance(x, str) else "-".join(x))
def test_the_trainer_loss_is_the_hand_loss_and_the_split_does_not_matter(algorithm, over):
    from inference.tiny import build_model
    from trainer.policy import response_logprobs
    tok, cfg, rows, cur, old, ent_kept, cov, total, records, ref = _step(algorithm, 64, **over)
    # by hand: the table entry with the mini-batch's selection, the mask with the kept tokens, D = Σ mask
    model = build_model("1m", tok, seed=3)
    with torch.no_grad():
        logp, _, resp = response_logprobs(model, [r.prompt_ids for r in rows], [r.response_ids for r in rows],
                                          pad_id=tok.pad_token_id, device="cpu", forward="model")
    R = logp.shape[1]
    old_t = logp if old is None else _stack(rows, [old[r.uid] for r in rows], R, 0.0)
    sel = None if cov is None else _stack(rows, [cov[r.uid] for r in rows], R, 0.0).bool()
    loss_mat, _ = LOSSES[cfg.algorithm](token_batch(rows, logp, old_t, resp, None, sel), **loss_kwargs(cfg))
    mask = rows_loss_mask(cfg, rows, rollout_keep_masks(cfg, rows, old), ent_kept)
    want = float(reduce_loss(loss_mat, mask, mode="token-mean", denominator=float(mask.sum())))
    assert total == pytest.approx(want, abs=1e-6)
    n_resp = sum(len(r.response_ids) for r in rows)
    if ent_kept is not None:   # the kept tokens alone make the denominator
        base = rows_loss_mask(cfg, rows, rollout_keep_masks(cfg, rows, old))
        assert int(mask.sum()) == high_entropy_count(int(base.sum()), cfg.high_entropy_ratio) < n_resp
        assert sum(sum(rec.loss_mask) for rec in records.values()) == int(mask.sum())
    if cov is not None:   # some tokens really are restrained, and only loss tokens
        assert 0 < int((sel & mask).sum()) == int(sel.sum()) < int(mask.sum())
    for mbs in (1, 5):
        *_, t, _, g = _step(algorithm, mbs, **over)
        assert t == pytest.approx(total, abs=1e-6)
        assert max(float((ref[k] - g[k]).abs().max()) for k in ref) <= 1e-6


def test_the_trainer_refuses_a_selection_it_was_not_given():
    tok, cfg, rows, model, cur, ent = _setup("kl_cov")
    with pytest.raises(AssertionError, match="needs the selected tokens"):
        backward_minibatch(model, cfg, rows, Dist(), pad_id=tok.pad_token_id)
    tok, cfg, rows, model, cur, ent = _setup("dapo", token_mask="high_entropy")
    with pytest.raises(AssertionError, match="needs the kept tokens"):
        backward_minibatch(model, cfg, rows, Dist(), pad_id=tok.pad_token_id)


# ---------------------------------------------------------------------------------------------- presets and runs
PRESETS = ["mini_clip_cov", "mini_kl_cov", "mini_passk", "mini_w_reinforce", "mini_high_entropy"]
TINY = {"model": "tiny:1m", "sft_steps": 0, "task_kwargs": json.dumps({"min_digits": 1, "max_digits": 1}),
        "num_train_examples": 64, "prompts_per_step": 4, "samples_per_prompt": 8, "max_response_tokens": 6,
        "lr": 1e-3, "total_steps": 2, "save_every": 0, "progress": False, "dynamic_sampling": False}


# a reward that mixes 0s and 1s within groups from the first step (a fresh tiny policy solves nothing), as
# tests/trainer/test_kl_penalty.py's
PARITY = "def parity(response, example):\n    return sum(map(ord, response)) % 2 == 0\n"


@pytest.fixture
def parity_reward(tmp_path, monkeypatch) -> str:
    (tmp_path / "r25_exploration_rewards.py").write_text(PARITY)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "r25_exploration_rewards:parity"


def _preset(name: str) -> Path:
    return REPO / "trainer" / "configs" / f"{name}.yaml"


def test_the_presets_load_with_the_reference_defaults():
    c = load_config(_preset("mini_clip_cov"))
    assert (c.algorithm, c.clip_cov_ratio, c.clip_cov_lb, c.clip_cov_ub, c.clip_low, c.clip_high) == \
        ("clip_cov", 2e-4, 1.0, 5.0, 1.0, 1.0)
    c = load_config(_preset("mini_kl_cov"))
    assert (c.algorithm, c.kl_cov_ratio, c.kl_cov_coef, c.mini_batches_per_step) == ("kl_cov", 2e-3, 1.0, 4)
    c = load_config(_preset("mini_passk"))
    assert (c.advantage, c.passk_k) == ("passk", 4)
    c = load_config(_preset("mini_w_reinforce"))
    assert (c.advantage, c.w_reinforce_lambda, c.dynamic_sampling) == ("w_reinforce", 0.1, False)
    c = load_config(_preset("mini_high_entropy"))
    assert (c.token_mask, c.high_entropy_ratio) == ("high_entropy", 0.2)
    d = load_config(None)   # the defaults are the papers' too
    assert (d.clip_cov_ratio, d.clip_cov_lb, d.clip_cov_ub, d.kl_cov_ratio, d.kl_cov_coef, d.w_reinforce_lambda,
            d.high_entropy_ratio, d.advantage, d.token_mask) == (2e-4, 1.0, 5.0, 2e-3, 1.0, 0.1, 0.2, "grpo", "none")


def _expected_adv(cfg, rewards: list[float], groups: list[int]) -> list[float]:
    r = np.asarray(rewards, dtype=np.float64)
    out = np.zeros_like(r)
    for g in set(groups):
        i = np.flatnonzero(np.asarray(groups) == g)
        if cfg.advantage == "w_reinforce":
            out[i] = np.where(r[i] == 1, cfg.w_reinforce_lambda, -1.0)
        else:
            out[i] = _passk_by_enumeration(list(r[i]), cfg.passk_k)
    return np.nan_to_num(out).tolist()


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_a_tiny_run_of_each_preset(tmp_path, capsys, parity_reward, preset):
    import pyarrow.parquet as pq
    over = {**TINY, "output_dir": str(tmp_path), "run_name": "run", "reward_fn": parity_reward}
    assert main(["--config", str(_preset(preset)), *[f"{k}={v}" for k, v in over.items()]]) == 0, \
        capsys.readouterr().err
    cfg = load_config(tmp_path / "run" / "config.yaml")
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1]
    want = {"mini_clip_cov": ["clip_cov/selected_share", "clip_cov/selected_tokens"],
            "mini_kl_cov": ["kl_cov/selected_share", "kl_cov/selected_tokens"],
            "mini_high_entropy": ["entropy_mask/kept_share", "entropy_mask/kept_tokens", "entropy_mask/threshold"]}
    for m in lines:
        assert math.isfinite(m["ppo/loss"]) and math.isfinite(m["ppo/grad_norm"])
        for key in want.get(preset, []):
            assert key in m and math.isfinite(m[key]), (key, m)
        # ⌊r·N⌋ < 1 at this size: max(., 1) = one token per update (4 updates), for Clip-Cov only if one lies in
        # (1, 5) (a fresh tiny policy's covariances are mostly smaller)
        if preset == "mini_kl_cov":
            assert m["kl_cov/selected_tokens"] == cfg.mini_batches_per_step == 4
            assert 0 < m["kl_cov/selected_share"] < 0.5
        if preset == "mini_clip_cov":
            assert 0 <= m["clip_cov/selected_tokens"] <= 4 and 0 <= m["clip_cov/selected_share"] < 0.5
        if preset == "mini_high_entropy":   # ⌈0.2 N⌉ of N loss tokens
            n = m["entropy_mask/kept_tokens"]
            assert 0.2 <= m["entropy_mask/kept_share"] < 0.2 + 1.0 / (5 * n) + 1e-9 or n == 1
            assert m["tokens/trained"] == n
    if preset in ("mini_passk", "mini_w_reinforce"):   # the recorded advantages are the formula's of the rewards
        for step in (0, 1):
            t = pq.read_table(tmp_path / "run" / "rollouts" / f"step_{step:06d}.parquet").to_pydict()
            groups = [hash(p) for p in t["prompt_id"]]
            got = t["advantage"]
            assert got == pytest.approx(_expected_adv(cfg, t["reward"], groups), abs=1e-5)
            assert 0 < sum(t["reward"]) < len(got) and len({round(a, 6) for a in got}) >= 2   # not all one value


@pytest.mark.parametrize("over, expected", [
    ({"advantage": "passk", "passk_k": 9}, "passk_k must lie in [1, samples_per_prompt=8]"),
    ({"advantage": "passk", "passk_k": 0}, "passk_k must lie in"),
    ({"advantage": "w_reinforce", "w_reinforce_lambda": -0.1}, "w_reinforce_lambda must be >= 0"),
    ({"advantage": "passk", "overlong_buffer_tokens": 16}, "is defined for binary rewards"),
    ({"advantage": "pass_at_k"}, "advantage"),
    ({"algorithm": "clip_cov", "clip_cov_ratio": 0.0}, "clip_cov_ratio must lie in (0, 1]"),
    ({"algorithm": "clip_cov", "clip_cov_lb": 5.0, "clip_cov_ub": 5.0}, "must be below clip_cov_ub"),
    ({"algorithm": "kl_cov", "kl_cov_ratio": 2.0}, "kl_cov_ratio must lie in (0, 1]"),
    ({"algorithm": "kl_cov", "kl_cov_coef": -1.0}, "kl_cov_coef must be >= 0"),
    ({"token_mask": "high_entropy", "high_entropy_ratio": 0.0}, "high_entropy_ratio must lie in (0, 1]"),
    ({"token_mask": "forking"}, "token_mask"),
])
def test_bad_values_are_config_errors(over, expected):
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"{k}={v}" for k, v in over.items()])
    assert expected in str(err.value)


def test_a_bad_value_is_one_line_exit_2(tmp_path, capsys):
    assert main([f"output_dir={tmp_path / 'runs'}", "token_mask=high_entropy", "high_entropy_ratio=1.5"]) == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error") and "high_entropy_ratio" in lines[0], lines
    assert not (tmp_path / "runs").exists()


def test_w_reinforce_with_dynamic_sampling_is_warned_about():
    from trainer.config import learning_warnings
    assert any("w_reinforce" in w for w in learning_warnings(load_config(None, ["advantage=w_reinforce"])))
    assert not learning_warnings(load_config(_preset("mini_w_reinforce")))

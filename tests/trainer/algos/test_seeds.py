"""Thinking Seeds truncation rules, token factor and the two loss variants (paper Eq. 5)."""

import math

import pytest
import torch

from trainer.algos import (
    LOSSES,
    SEED_RULES,
    Cut,
    CutBatch,
    TokenBatch,
    new_arm_stats,
    clipped_policy_loss,
    loss_denominator,
    reduce_loss,
    entropy_seed_lengths,
    ratio_seed_lengths,
    seed_loss_mask,
    seed_old_logp,
    seed_token_mask,
    token_factor,
    top_entropy_positions,
)


# (L, ratio, ends_with_eos, m): m = floor(L·ratio + 1/2), at most L − 1 when the response ends with EOS
RATIO_CASES = [
    (5, 0.5, False, 3),  # 2.5 -> 3 (half up)
    (3, 0.5, False, 2),  # 1.5 -> 2
    (7, 0.3, False, 2),  # 2.1 -> 2
    (10, 0.25, False, 3),  # 2.5 -> 3
    (4, 0.7, False, 3),  # 2.8 -> 3
    (45, 0.7, False, 32),  # 31.5; in floats 45 * 0.7 = 31.499999999999996, a naive floor(x + 0.5) gives 31
    (90, 0.35, False, 32),  # 31.5; floats give 31.499999999999996
    (1, 0.5, False, 1),  # 0.5 -> 1
    (1, 0.5, True, 0),  # ... but the only token is EOS
    (5, 1.0, False, 5),  # ratio 1 without EOS: the whole (length-truncated) response
    (5, 1.0, True, 4),  # ratio 1 with EOS: everything but EOS
    (6, 0.9, True, 5),  # 5.4 -> 5, EOS bound not binding
    (5, 0.9, True, 4),  # 4.5 -> 5 -> clamped to 4
    (5, 0.0, False, 0),
    (5, 0.0, True, 0),
    (0, 0.5, False, 0),
]


def test_ratio_seed_lengths_hand_cases():
    lengths = torch.tensor([c[0] for c in RATIO_CASES])
    for ratio in sorted({c[1] for c in RATIO_CASES}):
        rows = [i for i, c in enumerate(RATIO_CASES) if c[1] == ratio]
        eos = torch.tensor([RATIO_CASES[i][2] for i in rows])
        got = ratio_seed_lengths(lengths[rows], ratio, ends_with_eos=eos)
        assert got.dtype == torch.long
        assert got.tolist() == [RATIO_CASES[i][3] for i in rows], f"ratio={ratio}"
    # ends_with_eos defaults to all False
    assert ratio_seed_lengths(torch.tensor([5, 3, 1]), 0.5).tolist() == [3, 2, 1]


def test_ratio_seed_lengths_rejects_bad_ratio():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        ratio_seed_lengths(torch.tensor([4]), 1.5)


def test_entropy_rule_cuts_only_at_top_k_and_is_uniform():
    # distinct entropies over 50 positions; the 5 largest sit at positions 3, 17, 20, 41, 49
    e = torch.linspace(0.0, 1.0, 50)[torch.randperm(50, generator=torch.Generator().manual_seed(0))] * 0.5
    top = [3, 17, 20, 41, 49]
    e[top] = torch.tensor([2.0, 1.5, 1.9, 1.7, 1.6])
    draws = 20000
    picks = entropy_seed_lengths([e] * draws, k=5, generator=torch.Generator().manual_seed(1))
    assert picks.shape == (draws,) and picks.dtype == torch.long
    assert set(picks.tolist()) == set(top)
    counts = torch.bincount(picks, minlength=50)[top].double()
    chi2 = ((counts - draws / 5) ** 2 / (draws / 5)).sum().item()
    assert chi2 < 18.47, f"chi-square {chi2:.2f} over 4 dof exceeds the p=0.001 quantile"
    assert sorted(top_entropy_positions(e, k=5).tolist()) == top
    # same generator seed, same cuts
    again = entropy_seed_lengths([e] * draws, k=5, generator=torch.Generator().manual_seed(1))
    assert torch.equal(picks, again)


def test_entropy_rule_fewer_than_k_ties_and_empty():
    draws = 6000
    short = torch.tensor([0.2, 0.1, 0.3])  # fewer than k positions: all are candidates, uniformly
    picks = entropy_seed_lengths([short] * draws, k=32, generator=torch.Generator().manual_seed(2))
    counts = torch.bincount(picks, minlength=3).double()
    assert counts.sum() == draws
    chi2 = ((counts - draws / 3) ** 2 / (draws / 3)).sum().item()
    assert chi2 < 13.82, f"chi-square {chi2:.2f} over 2 dof exceeds the p=0.001 quantile"

    # ties are broken by position, earlier first: top-2 of [1, 3, 3, 3, 0] is {1, 2}
    tied = torch.tensor([1.0, 3.0, 3.0, 3.0, 0.0])
    picks = entropy_seed_lengths([tied] * 400, k=2, generator=torch.Generator().manual_seed(3))
    assert set(picks.tolist()) == {1, 2}
    assert top_entropy_positions(tied, k=2).tolist() == [1, 2]

    # mixed lengths in one call, an empty response -> 0
    mixed = [torch.tensor([0.0, 5.0, 1.0]), torch.zeros(0), torch.tensor([7.0])]
    assert entropy_seed_lengths(mixed, k=1, generator=torch.Generator().manual_seed(4)).tolist() == [1, 0, 0]
    assert entropy_seed_lengths([], k=4).numel() == 0


def test_the_seed_rules_table_cuts_as_the_rules_by_hand():
    from trainer.config import SEED_RULE_NAMES
    assert tuple(SEED_RULES) == SEED_RULE_NAMES == ("ratio", "entropy", "adaptive")
    src = CutBatch.of([   # five tokens ending in EOS (the source was wrong), three cut by the budget (right)
        {"response_ids": [1, 2, 3, 4, 5], "finish_reason": "stop", "logp": None, "step": 0, "correct": False,
         "entropy": torch.tensor([0.1, 3.0, 0.2, 2.0, 9.0])},
        {"response_ids": [6, 7, 8], "finish_reason": "length", "logp": None, "step": 0, "correct": True,
         "entropy": torch.tensor([5.0, 1.0, 4.0])}])
    assert src.lengths.tolist() == [5, 3] and src.ends_with_eos.tolist() == [True, False]
    # ratio 0.5: 2.5 -> 3 (below the EOS at 4) and 1.5 -> 2
    assert SEED_RULES["ratio"](src, ratio=0.5) == Cut([3, 2])
    # entropy, k = 1: the highest entropy left of the EOS (9.0 is the EOS: never a cut), and position 0
    assert SEED_RULES["entropy"](src, k=1, seed=0) == Cut([1, 0])
    # k = 2 draws with the seed's generator, as entropy_seed_lengths does
    ents = [torch.tensor([0.1, 3.0, 0.2, 2.0]), torch.tensor([5.0, 1.0, 4.0])]
    for seed in range(5):
        want = entropy_seed_lengths(ents, k=2, generator=torch.Generator().manual_seed(seed)).tolist()
        assert SEED_RULES["entropy"](src, k=2, seed=seed) == Cut(want) and set(want[:1]) <= {1, 3}
    # adaptive: statistics where a wrong source's continuations succeed half the time at arm 1 (ratio 0.5) and a
    # right one's at arm 2 (0.75): 0.5 of 5 tokens -> 3, 0.75 of 3 -> 2.25 -> 2; the arms come back for the counts
    stats = new_arm_stats(3)
    stats["wrong"] = {"wins": [2, 400, 950], "losses": [980, 400, 5]}
    stats["correct"] = {"wins": [950, 970, 500], "losses": [5, 3, 500]}
    assert SEED_RULES["adaptive"](src, n_arms=3, stats=stats, seed=7) == Cut([3, 2], [1, 2])


def test_token_factor():
    assert token_factor(0.5, 8) == 1.4375  # the paper's "1.44x"
    assert token_factor(0.3, 8) == pytest.approx(1 + 0.7 * 7 / 8)
    assert token_factor(0.7, 1) == 1.0  # T = 1 is on-policy
    assert token_factor(1.0, 16) == 1.0
    with pytest.raises(ValueError):
        token_factor(0.5, 0)


RESPONSE_MASK = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.bool)
SEED_LENS = torch.tensor([2, 0, 1])


def test_seed_masks():
    assert seed_token_mask(RESPONSE_MASK, SEED_LENS).int().tolist() == [
        [1, 1, 0, 0, 0],
        [0, 0, 0, 0, 0],
        [1, 0, 0, 0, 0],
    ]
    assert torch.equal(seed_loss_mask(RESPONSE_MASK, SEED_LENS, variant="state+action"), RESPONSE_MASK)
    assert seed_loss_mask(RESPONSE_MASK, SEED_LENS, variant="state").int().tolist() == [
        [0, 0, 1, 1, 0],
        [1, 1, 1, 0, 0],
        [0, 1, 0, 0, 0],
    ]
    with pytest.raises(ValueError, match="state\\+action, state"):
        seed_loss_mask(RESPONSE_MASK, SEED_LENS, variant="action")


def test_seed_old_logp_reads_behavior_only_on_seed_tokens():
    old = torch.full((3, 5), -1.0)
    behavior = torch.full((3, 5), float("nan"))  # as cached: NaN outside the seed
    behavior[0, :2] = -2.0
    behavior[2, 0] = -3.0
    got = seed_old_logp(old, behavior, SEED_LENS)
    assert got.tolist() == [
        [-2.0, -2.0, -1.0, -1.0, -1.0],
        [-1.0, -1.0, -1.0, -1.0, -1.0],
        [-3.0, -1.0, -1.0, -1.0, -1.0],
    ]


def test_eq5_variants_hand_loss():
    # one response of 4 tokens, seed of 2, A = 1; π_θ = π_old = 0.5 everywhere, π_b = 0.25 on the seed:
    #   seed tokens r = 0.5 / 0.25 = 2 -> clipped at 1.28 -> ℓ = −1.28; continuation r = 1 -> ℓ = −1
    #   state+action: token-mean over 4 tokens = (2·(−1.28) + 2·(−1)) / 4 = −1.14
    #   state:        token-mean over the 2 continuation tokens = −1
    mask = torch.ones(1, 4, dtype=torch.bool)
    seed = torch.tensor([2])
    logp = torch.full((1, 4), math.log(0.5))
    behavior = torch.tensor([[math.log(0.25)] * 2 + [float("nan")] * 2])
    adv = torch.tensor([1.0])
    loss_sa, stats = clipped_policy_loss(logp, seed_old_logp(logp.clone(), behavior, seed), adv)
    assert stats["clipped_high"].tolist() == [[True, True, False, False]]

    def reduce(loss_mat, variant):
        m = seed_loss_mask(mask, seed, variant=variant)
        return reduce_loss(loss_mat, m, mode="token-mean", denominator=loss_denominator(m, mode="token-mean"))

    assert reduce(loss_sa, "state+action").item() == pytest.approx(-1.14, abs=1e-6)
    loss_s, _ = clipped_policy_loss(logp, logp.clone(), adv)
    assert reduce(loss_s, "state").item() == pytest.approx(-1.0, abs=1e-6)
    # the table's seeds entry is the same per-token loss (seed tokens against π_b) for both variants
    batch = TokenBatch(logp=logp, old_logp=logp.clone(), adv=adv, response_mask=mask, seed_lens=seed,
                       behavior_logp=behavior)
    table, _ = LOSSES["seeds"](batch, clip_low=0.2, clip_high=0.28)
    assert torch.equal(table, loss_sa)
    assert reduce(table, "state").item() == pytest.approx(-1.0, abs=1e-6)

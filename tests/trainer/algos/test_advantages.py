"""group_advantages and zero_variance_groups vs a Python-loop reference."""

import statistics

import pytest
import torch

from trainer.algos import group_advantages, zero_variance_groups


def _reference(rewards, group_ids, scale, eps):
    out = [0.0] * len(rewards)
    groups = {}
    for i, gid in enumerate(group_ids):
        groups.setdefault(gid, []).append(i)
    for members in groups.values():
        if len(members) < 2 or len({rewards[i] for i in members}) == 1:
            continue  # singleton or all-equal group: no relative signal, exactly 0
        vals = [rewards[i] for i in members]
        mean = sum(vals) / len(vals)
        std = statistics.stdev(vals)  # unbiased (N − 1)
        for i in members:
            out[i] = (rewards[i] - mean) / (std + eps) if scale == "std" else rewards[i] - mean
    return out


@pytest.mark.parametrize("scale", ["std", "none"])
@pytest.mark.parametrize("seed", range(5))
def test_group_advantages_matches_loop_reference(scale, seed):
    g = torch.Generator().manual_seed(seed)
    sizes = [1, 2, 3, 8, 8, 5, 1]
    ids = torch.cat([torch.full((s,), 1000 * k + 7 * seed) for k, s in enumerate(sizes)])  # non-contiguous ids
    rewards = torch.randint(0, 2, (ids.numel(),), generator=g).double()
    rewards[:10] = torch.rand(10, generator=g, dtype=torch.float64)  # some continuous rewards too
    perm = torch.randperm(ids.numel(), generator=g)  # shuffled group order
    ids, rewards = ids[perm], rewards[perm]
    got = group_advantages(rewards, ids, scale=scale, eps=1e-6)
    want = torch.tensor(_reference(rewards.tolist(), ids.tolist(), scale, 1e-6), dtype=torch.float64)
    torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-9)


def test_group_advantages_hand_values():
    # group 5: rewards 1, 0, 0, 0 -> mean 0.25, unbiased std sqrt(0.25) = 0.5 (biased would be 0.433)
    #   advantages (1 − 0.25)/0.5 = 1.5 and (0 − 0.25)/0.5 = −0.5; group 9: singleton -> 0; group 2: all equal -> 0
    rewards = torch.tensor([0.0, 1.0, 1.0, 0.0, 0.0, 0.7, 1.0])
    ids = torch.tensor([5, 5, 2, 5, 5, 9, 2])
    got = group_advantages(rewards, ids, eps=0.0)
    torch.testing.assert_close(got, torch.tensor([-0.5, 1.5, 0.0, -0.5, -0.5, 0.0, 0.0]))
    assert got.dtype == torch.float32
    torch.testing.assert_close(
        group_advantages(rewards, ids, scale="none"), torch.tensor([-0.25, 0.75, 0.0, -0.25, -0.25, 0.0, 0.0])
    )
    assert zero_variance_groups(rewards, ids).tolist() == [False, False, True, False, False, True, True]


def test_group_advantages_errors_and_empty():
    with pytest.raises(ValueError, match="std, none"):
        group_advantages(torch.zeros(2), torch.zeros(2, dtype=torch.long), scale="mad")
    assert group_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long)).numel() == 0

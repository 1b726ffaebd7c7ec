"""Per-prompt generation budgets and ignore_eos (used by seeded continuations and token accounting)."""

import pytest
import torch

from tests.helpers.models import tiny_llama
from inference.hf import HFSampler


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return tiny_llama(seed=1)


@pytest.mark.parametrize("fast", [True, False])
def test_per_prompt_budgets_truncate_greedy_exactly(model, fast):
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]
    s = HFSampler(model, eos_token_id=[-1], pad_token_id=0, fast=fast)
    full = s.generate(prompts, max_new_tokens=12, temperature=0.0)
    budgets = [3, 0, 12, 7]
    part = s.generate(prompts, max_new_tokens=budgets, temperature=0.0)
    for f, p, m in zip(full, part, budgets):
        assert p.token_ids == f.token_ids[:m]
        assert len(p.token_ids) == m and p.finish_reason == "length"


def test_ignore_eos_fills_every_budget(model):
    # Make the most likely first token the EOS id: with ignore_eos the row still runs to its budget.
    prompts = [[5, 6, 7]] * 4
    greedy_first = HFSampler(model, eos_token_id=[-1], pad_token_id=0).generate(prompts, max_new_tokens=1, temperature=0.0)
    eos = greedy_first[0].token_ids[0]
    stops = HFSampler(model, eos_token_id=eos, pad_token_id=0).generate(prompts, max_new_tokens=9, temperature=0.0)
    assert all(c.token_ids == [eos] and c.finish_reason == "stop" for c in stops)
    runs = HFSampler(model, eos_token_id=eos, pad_token_id=0, ignore_eos=True).generate(
        prompts, max_new_tokens=[9, 4, 1, 6], temperature=0.0)
    assert [len(c.token_ids) for c in runs] == [9, 4, 1, 6]
    assert all(c.finish_reason == "length" for c in runs)


def test_budget_list_length_must_match(model):
    s = HFSampler(model, eos_token_id=[-1], pad_token_id=0)
    with pytest.raises(ValueError, match="2 budgets for 3 prompts"):
        s.generate([[1], [2], [3]], max_new_tokens=[1, 2])

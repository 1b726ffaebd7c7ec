"""The flat (padding-free, shared-prompt) training forward computes what the model's own forward computes."""

from __future__ import annotations

import random

import pytest
import torch

from inference.flat import build_layout, unsupported_reason
from trainer.policy import micro_batches, response_logprobs, use_flat

PAD = 0


def _model(arch: str, *, kv_heads: int = 2):
    from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                              Qwen3ForCausalLM)
    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
                             "qwen3": (Qwen3Config, Qwen3ForCausalLM)}[arch]
    torch.manual_seed(0)
    cfg = config_cls(vocab_size=50, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=kv_heads, head_dim=16, max_position_embeddings=128,
                     tie_word_embeddings=arch == "llama", bos_token_id=1, eos_token_id=2, pad_token_id=PAD)
    model = model_cls(cfg)
    with torch.no_grad():   # non-trivial biases and norm weights, so a skipped bias or norm shows
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model


def _batch(seed: int = 0, groups: int = 4, per: int = 3):
    rng = random.Random(seed)
    prompts, responses = [], []
    for _ in range(groups):
        p = [rng.randrange(3, 50) for _ in range(rng.randint(1, 9))]
        for _ in range(per):
            prompts.append(list(p))
            responses.append([rng.randrange(3, 50) for _ in range(rng.choice([0, 1, 2, 5, 11]))])
    responses[1] = [7] * 11          # the longest response sits in the middle of a group
    return prompts, responses


def _logps_and_grads(model, prompts, responses, forward, *, temperature=1.0):
    model.zero_grad(set_to_none=True)
    logp, ent, mask = response_logprobs(model, prompts, responses, pad_id=PAD, device="cpu",
                                        temperature=temperature, forward=forward)
    w = torch.linspace(-1.0, 2.0, logp.numel()).view_as(logp)   # a loss that weighs every token differently
    ((logp * w).masked_fill(~mask, 0).sum() + (ent * mask).sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), ent.detach(), mask, grads


@pytest.mark.parametrize("arch,kv_heads", [("llama", 4), ("llama", 2), ("qwen2", 2), ("qwen3", 2)])
def test_flat_forward_matches_the_models_forward(arch, kv_heads):
    model = _model(arch, kv_heads=kv_heads)
    assert use_flat(model, "auto")
    prompts, responses = _batch()
    lp_m, en_m, mask_m, g_m = _logps_and_grads(model, prompts, responses, "model")
    lp_f, en_f, mask_f, g_f = _logps_and_grads(model, prompts, responses, "flat")
    assert torch.equal(mask_m, mask_f)
    assert int(mask_f.sum()) == sum(len(r) for r in responses)
    assert torch.allclose(lp_m[mask_m], lp_f[mask_f], atol=2e-5), (lp_m[mask_m] - lp_f[mask_f]).abs().max()
    assert torch.allclose(en_m[mask_m], en_f[mask_f], atol=2e-5)
    assert (lp_f[~mask_f] == 0).all()
    assert g_m.keys() == g_f.keys() and len(g_f) == len(list(model.parameters()))
    for name in g_m:
        scale = g_m[name].abs().max().clamp(min=1e-3)
        err = (g_m[name] - g_f[name]).abs().max() / scale
        assert err < 1e-4, f"{name}: relative gradient error {err:.2e}"


def test_flat_forward_with_temperature_and_gradient_checkpointing():
    model = _model("llama")
    prompts, responses = _batch(seed=3)
    lp_m, _, mask, g_m = _logps_and_grads(model, prompts, responses, "model", temperature=0.7)
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    assert any(getattr(x, "gradient_checkpointing", False) for x in model.model.layers)
    model.train()
    lp_f, _, _, g_f = _logps_and_grads(model, prompts, responses, "flat", temperature=0.7)
    assert torch.allclose(lp_m[mask], lp_f[mask], atol=2e-5)
    for name in g_m:
        assert torch.allclose(g_m[name], g_f[name], atol=1e-5, rtol=1e-4), name


def test_layout_shares_each_prompt_and_skips_padding():
    # 2 distinct prompts (lengths 3 and 5) x 4 samples, responses of 4 tokens: the padded layout runs
    # 8 x (5 + 4) = 72 token positions; the flat one runs 3 + 5 prompt tokens and 8 x 3 response inputs = 32
    prompts = [[5, 6, 7]] * 4 + [[8, 9, 10, 11, 12]] * 4
    responses = [[20, 21, 22, 23]] * 8
    lay = build_layout(prompts, responses, device="cpu", neg=-1e9)
    assert lay.ids.numel() == 32 and lay.n_prompt == 8
    assert lay.ids[:8].tolist() == [5, 6, 7, 8, 9, 10, 11, 12]
    assert lay.pos.tolist()[:8] == [0, 1, 2, 0, 1, 2, 3, 4]
    assert lay.pos.tolist()[8:11] == [3, 4, 5] and lay.pos.tolist()[-3:] == [5, 6, 7]
    # the first response token of every row of a group is predicted from the same flat position
    assert lay.logit_src.view(8, 4)[:, 0].tolist() == [2] * 4 + [7] * 4
    assert lay.targets.tolist() == [20, 21, 22, 23] * 8


def test_unsupported_models_fall_back_or_fail_clearly():
    model = _model("llama")
    model.config.attention_dropout = 0.1
    model.train()
    assert "dropout" in unsupported_reason(model)
    assert not use_flat(model, "auto")
    with pytest.raises(ValueError, match="train_forward=flat cannot run this model: attention dropout"):
        use_flat(model, "flat")
    assert not use_flat(_model("llama"), "model")


def test_micro_batches_keep_groups_together_under_a_flat_token_budget():
    # 3 prompts x 4 samples; the flat cost of a micro-batch counts each distinct prompt once
    shapes = [(10, r) for r in (3, 9, 1, 5)] + [(4, r) for r in (2, 2, 8, 8)] + [(6, r) for r in (7, 1, 1, 1)]
    keys = [0] * 4 + [1] * 4 + [2] * 4
    batches, count = micro_batches(shapes, rows=12, tokens=40, prompt_keys=keys)
    assert sorted(i for b in batches for i in b) == list(range(12)) and count == len(batches)
    for b in batches:
        cost = sum(shapes[i][1] for i in b) + sum({keys[i]: shapes[i][0] for i in b}.values())
        assert cost <= 40
    # group 0 costs 10 + 18 = 28, group 1 4 + 20 = 24, group 2 6 + 10 = 16: each micro-batch holds whole groups
    assert [sorted({keys[i] for i in b}) for b in batches] == [[0], [1, 2]]
    # a budget smaller than a group splits it row by row, its prompt counted once per micro-batch
    batches, _ = micro_batches(shapes, rows=12, tokens=20, prompt_keys=keys)
    assert sorted(i for b in batches for i in b) == list(range(12))
    for b in batches:
        assert sum(shapes[i][1] for i in b) + sum({keys[i]: shapes[i][0] for i in b}.values()) <= 20
    assert [b for b in batches if 0 in b][0] == [0]              # 10 + 3 + 9 = 22 > 20: row 1 starts the next
    batches, _ = micro_batches(shapes, rows=3, prompt_keys=keys)
    assert [len(b) for b in batches] == [3, 3, 3, 3]


def test_flat_forward_in_bfloat16():
    # the GPU dtype: the same numbers up to bf16 rounding, and gradients reach the bf16 weights
    model = _model("qwen2").to(torch.bfloat16)
    prompts, responses = _batch(seed=5)
    lp_m, _, mask = response_logprobs(model, prompts, responses, pad_id=PAD, device="cpu", forward="model")
    lp_f, _, mask_f = response_logprobs(model, prompts, responses, pad_id=PAD, device="cpu", forward="flat")
    assert lp_f.dtype == torch.float32 and torch.equal(mask, mask_f)
    assert (lp_m[mask] - lp_f[mask]).abs().max() < 2e-2          # log-probs are ~4 nats here
    lp_f[mask].sum().backward()
    assert model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0


def test_every_attention_call_is_one_a_cuda_fused_kernel_accepts(monkeypatch):
    """The flat forward's SDPA calls are causal over blocks of whole rows, with no mask and grouped keys as they are:
    FlashAttention's constraints in bf16, where the old masked grouped-key call met no fused kernel's and fell to
    the math kernel ([B, heads, Q, S] fp32 scores, and an [n, 1, Q, P + Q] mask built on the host). Rows are
    blocked by length, so padding stays within BUCKET_RATIO of each block's longest row. The kernel is recorded
    (here the CPU's own choice), and the numbers do not move."""
    import torch.nn.functional as F
    from inference import flat
    from inference.flat import BACKENDS, BUCKET_RATIO, cuda_fused_kernels
    assert cuda_fused_kernels(128, torch.bfloat16, mask=True, is_causal=False, gqa=True) == []   # the old call
    calls, real = [], F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
        calls.append((q.shape[-1], q.dtype, attn_mask is not None, is_causal, enable_gqa, q.shape[1], k.shape[1]))
        return real(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)

    model = _model("qwen2", kv_heads=2).to(torch.bfloat16)
    prompts, responses = _batch(seed=3)
    lp_before, _, mask = response_logprobs(model, prompts, responses, pad_id=PAD, device="cpu", forward="model")
    monkeypatch.setattr(flat.F, "scaled_dot_product_attention", spy)
    BACKENDS.clear()
    lp, _, mask_f = response_logprobs(model, prompts, responses, pad_id=PAD, device="cpu", forward="flat")
    lay = build_layout(prompts, responses, device="cpu")
    assert len(calls) == 2 * len(lay.blocks) and 1 < len(lay.blocks) < len(prompts)   # two layers
    for head_dim, dtype, has_mask, causal, gqa, nq, nk in calls:
        assert not has_mask and causal and gqa and (nq, nk) == (4, 2)
        assert cuda_fused_kernels(head_dim, dtype, mask=has_mask, is_causal=causal, gqa=gqa) == ["flash"]
    lengths = [len(p) + max(0, len(r) - 1) for p, r in zip(prompts, responses)]   # a row's sequence
    widths, held = [], []
    for blk in lay.blocks:   # a row's length in its block: past its last real flat index (index 0 is also token 0)
        rows = [int(row.nonzero().max()) + 1 if row.any() else 1 for row in blk]
        assert max(rows) == blk.shape[1] and min(rows) >= BUCKET_RATIO * blk.shape[1]
        widths.append(blk.shape[1])
        held += rows
    assert sorted(held) == sorted(lengths) and widths == sorted(widths, reverse=True)
    assert set(BACKENDS) == {"cpu/blocks"} and all(BACKENDS.values())
    assert torch.equal(mask, mask_f) and (lp_before[mask] - lp[mask]).abs().max() < 2e-2


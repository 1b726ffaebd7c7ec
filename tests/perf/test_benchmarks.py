"""Smoke test of the benchmarks: every benchmark at a tiny size with one repeat (the numbers mean nothing here).

Checks the result files and their structure, that every measured side has finite positive samples and every
check a finite positive value (with PASS/MISS decided), and the harness pieces (alternation order, summaries).
The GPU section is skipped without CUDA (and its numbers checked with it); its Qwen2 plumbing runs here at toy
size on the CPU.
"""

import importlib.util
import json
import math
from pathlib import Path

import pytest

from perf import common
from perf.run import BENCHMARKS, main

CPU_BENCHMARKS = [n for n in BENCHMARKS if n != "gpu"]
HAVE_TRL = importlib.util.find_spec("trl") is not None
pytestmark = pytest.mark.slow   # about a minute: every benchmark runs once at a tiny size


THREADS = {}   # torch's thread count before the benchmarks ran in this process


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    import torch
    out = tmp_path_factory.mktemp("bench")
    argv = ["--quick", "--repeats", "1", "--warmup", "0", "--threads", "1", "--in-process", "--tokens", "2e5",
            "--out", str(out), "--tmp", str(out)]
    THREADS["before"] = torch.get_num_threads()
    try:
        assert main(argv) == 0
    finally:   # in-process benchmarks pin torch to --threads: give every later test its thread count back
        torch.set_num_threads(THREADS["before"])
    return out


def test_benchmarks_leave_the_torch_thread_count_as_they_found_it(results):
    import torch
    assert THREADS["before"] >= 1 and torch.get_num_threads() == THREADS["before"]


def test_result_files_exist(results):
    for name in BENCHMARKS:
        assert (results / f"{name}.json").is_file(), name
        assert (results / f"{name}.md").is_file(), name
    summary = json.loads((results / "results.json").read_text())
    assert [r["name"] for r in summary["results"]] == list(BENCHMARKS)
    assert summary["machine"]["usable_cores"] >= 1
    assert "## Checks" in (results / "summary.md").read_text()


@pytest.mark.parametrize("name", CPU_BENCHMARKS)
def test_benchmark_result_structure(results, name):
    r = json.loads((results / f"{name}.json").read_text())
    if name == "trainer_vs_trl" and not HAVE_TRL:
        assert "pip install" in r["skipped"]
        return
    assert r["skipped"] is None, r["skipped"]
    assert set(r) >= {"name", "description", "params", "sides", "checks", "tables", "info", "load", "elapsed_s"}
    assert r["load"]["before"]["loadavg"] and r["load"]["after"]["loadavg"]
    for s in r["sides"]:
        assert s["n"] == len(s["samples"]) >= 1, s
        assert all(math.isfinite(x) and x > 0 for x in s["samples"]), s
        assert s["min"] <= s["median"] <= s["max"], s
    for c in r["checks"]:
        assert c["op"] in ("<=", ">=") and isinstance(c["passed"], bool), c
        assert math.isfinite(c["value"]) and c["value"] >= 0, c
        assert math.isfinite(c["target"]) and c["target"] > 0, c
    if name in ("scaling", "padding"):   # tables of counts and sizes, no timed sides
        assert r["checks"] or name == "scaling"
        for rows in r["tables"].values():   # shares may be 0 (the flat forward pads nothing)
            assert rows and all(math.isfinite(v) and v >= (0 if name == "padding" else 1e-12) for row in rows
                                for v in row.values() if isinstance(v, (int, float))), rows
    else:
        assert r["sides"] and r["checks"], name
        ratios = [c for c in r["checks"] if "RSS" not in c["name"] and "token_factor" not in c["name"]]
        assert ratios and all(c["value"] > 0 for c in ratios), r["checks"]


def test_binning_results_agree(results):
    info = json.loads((results / "binning.json").read_text())["info"]
    assert info["results_agree"] is True
    assert info["synth_tokens"] >= 2e5


def test_seeds_token_accounting_is_exact(results):
    r = json.loads((results / "seeds_overhead.json").read_text())
    assert r["info"]["token_ratio_measured"] == pytest.approx(r["info"]["token_factor_formula"], abs=1e-12)


def test_gpu_section_skips_without_cuda_and_measures_with_it(results):
    import torch

    from trainer.algos import token_factor
    r = json.loads((results / "gpu.json").read_text())
    assert r["name"] == "gpu" and r["params"]["spec"] == "qwen2-0.5b"
    if not torch.cuda.is_available():
        assert r["skipped"] and "CUDA" in r["skipped"]
        assert r["sides"] == [] and r["checks"] == []
        return
    assert r["skipped"] is None
    assert "rollout_error" not in r["info"] and "trainer_error" not in r["info"], r["info"]
    assert r["info"]["gpus"] == torch.cuda.device_count() >= 1 and isinstance(r["info"]["vllm_installed"], bool)
    sides = {s["name"]: s for s in r["sides"]}
    want = {"hf rollout", "seeds step (cycle mean)", "dapo step (cycle mean)", "seeds gen_s", "seeds train_s",
            "dapo gen_s", "dapo train_s"} | ({"vllm rollout"} if r["info"]["vllm_installed"] else set())
    assert set(sides) == want
    for s in sides.values():
        assert s["n"] == len(s["samples"]) >= 1 and all(math.isfinite(x) and x > 0 for x in s["samples"]), s
    (check,) = r["checks"]
    assert check["name"] == "seeds / dapo seconds per step (GPU)" and check["target"] == 1.10
    assert math.isfinite(check["value"]) and check["value"] > 0 and isinstance(check["passed"], bool)
    # EOS ignored: the second cycle's generated tokens follow the token factor exactly (ratio 0.5, T = 8)
    assert r["info"]["token_ratio"] == pytest.approx(token_factor(0.5, 8), abs=1e-12)


def test_gpu_plumbing_on_cpu_at_toy_size():
    """The GPU section's children (Qwen2 from a config, handed to the trainer as its policy builder) run on the
    CPU at toy size."""
    import torch
    from transformers import Qwen2ForCausalLM

    from perf.bench_gpu import cycle_run, qwen2_policy_builder, rollout_run, token_ids_sampler_builder
    from inference.hf import HFSampler
    model, tok = qwen2_policy_builder("qwen2-toy")("ignored", dtype=torch.float32, seed=0)
    assert isinstance(model, Qwen2ForCausalLM) and model.config.vocab_size == 128
    assert tok.decode(tok("1+2")["input_ids"]) == "1+2"   # the character tokenizer, not Qwen's
    sampler = token_ids_sampler_builder(max_model_len=64)(model, tok, engine="hf", max_batch_size=4)
    assert isinstance(sampler, HFSampler) and sampler.max_batch_size == 4
    ro = rollout_run(spec="qwen2-toy", batch=4, prompt_len=5, new_tokens=4, repeats=1, engines=["hf"])
    assert len(ro["hf"]) == 1 and ro["hf"][0] > 0
    out = cycle_run(spec="qwen2-toy", algorithm="seeds", engine="hf", prompts=2, samples=2, max_tokens=4, T=2,
                    seed_ratio=0.5, micro_batch_size=4, device="cpu", dtype="float32")
    assert out["generated"] == [2 * 2 * 4 * 2, 2 * 2 * 2]   # refresh writes T batches; the seeded step regenerates half
    assert len(out["step_s"]) == 2 and all(x > 0 for x in out["step_s"])


def test_alternate_runs_sides_in_turn_and_skips_warmup():
    calls = []
    sides = common.alternate({"a": lambda: calls.append("a") or 1.0, "b": lambda: calls.append("b") or [2.0, 4.0]},
                             units="s", repeats=2, warmup=1)
    assert calls == ["a", "b"] * 3
    assert sides[0].samples == [1.0, 1.0] and sides[1].samples == [2.0, 4.0, 2.0, 4.0]
    assert (sides[1].min, sides[1].median, sides[1].max) == (2.0, 3.0, 4.0)


def test_check_and_unknown_benchmark():
    assert common.Check("x", 0.5, "<=", 0.7).passed and not common.Check("x", 0.8, "<=", 0.7).passed
    assert common.Check("x", 1.4, ">=", 1.3).passed and not common.Check("x", math.nan, ">=", 1.3).passed
    with pytest.raises(SystemExit):
        main(["--only", "no_such_benchmark"])


def test_peak_rss_measures_the_block_not_what_came_before():
    # a block after a larger peak in the same process still reads its own peak (ru_maxrss, which never goes down,
    # read 0 GB there: the quick logprob_memory side in CI). Anonymous mappings filled through numpy views: fresh
    # pages from the kernel and returned at close, whatever the allocator in this process keeps cached
    import mmap

    import numpy as np

    def touch(nbytes):
        m = mmap.mmap(-1, nbytes)
        view = np.frombuffer(m, dtype=np.uint8)
        view[:] = 1
        del view
        m.close()

    touch(300 * 2**20)                       # 300 MiB resident, then unmapped: the process's high-water mark
    with common.PeakRSS() as rss:
        touch(100 * 2**20)                   # 100 MiB, under the earlier peak
    if not rss.reset:
        pytest.skip("/proc/self/clear_refs is not writable here: the block is measured against ru_maxrss")
    assert 95 * 2**20 <= rss.peak <= 140 * 2**20, rss.peak / 2**20
    assert rss.sampled <= rss.peak


def test_padding_counts_at_the_paper_shapes():
    """The numbers docs/performance.md quotes (a seeded synthetic step, 8 ranks, the presets' micro-batch limits):
    the flat forward computes 0.55x the padded forward's GEMM tokens at the math preset (34 % padding and 10 %
    repeated prompts removed) and 0.85x at the 16k code preset, and 0.29x / 0.46x its query-key products, within
    9 % of causal attention's need."""
    from perf.bench_padding import PRESETS, count, synthetic_step
    got = {}
    for name, (mp, mr, n, G, mbs, mbt) in PRESETS.items():
        shapes, keys = synthetic_step(mp, mr, n, G)
        before = count(shapes, keys, rows=mbs, tokens=mbt, flat=False)
        after = count(shapes, keys, rows=mbs, tokens=mbt, flat=True)
        got[name] = (round(after["gemm_tokens"] / before["gemm_tokens"], 2),
                     round(after["attention_products"] / before["attention_products"], 2),
                     round(after["attention_products"] / after["attention_needed"], 2),
                     round(before["padded_share"], 2), round(before["repeated_prompt_share"], 2))
    assert got == {"qwen25math7b_seeds_entropy": (0.55, 0.29, 1.09, 0.34, 0.1),
                   "qwen3_4b_code_seeds_state": (0.85, 0.46, 1.03, 0.11, 0.06)}


def test_the_step_time_model_table_on_the_performance_page_is_the_models():
    """docs/performance.md's step-time table is ``python -m perf.step_model``'s, row for row, and the ratios the
    page states follow from it."""
    from perf.step_model import table
    page = (Path(__file__).resolve().parents[2] / "docs" / "performance.md").read_text()
    rows = table()
    for r in rows:
        line = "| " + " | ".join(str(v) for v in r.values()) + " |"
        assert line in page, line
    by = {r["preset"]: r for r in rows}
    ratio = lambda name: by[name]["step s"] / by[name]["verl DAPO step s"]
    assert (round(ratio("qwen25math7b_onpolicy"), 2), round(ratio("qwen3_4b_code_onpolicy"), 2)) == (0.84, 0.75)
    assert "0.84x (7B) and 0.75x (4B code)" in page
    assert (round(ratio("qwen25math7b_seeds_entropy"), 1), round(ratio("qwen3_4b_code_seeds_state"), 1)) == (1.0, 1.0)

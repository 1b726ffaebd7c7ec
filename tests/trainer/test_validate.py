"""Validation during training (trainer/validate.py) and the best checkpoint (trainer/checkpoint.py).

The end-to-end tests train the session's supervised tiny policy on addition and validate it on the embedded
``addition`` benchmark; a separate ``eval.run`` of a validated step's checkpoint, with the same seed and settings
(every val_* left to the benchmark's default except n and the problem limit, as eval.run's flags), must write the
same responses and verdicts and report the same avg@n. The fast tests cover the pieces: the schedule, the scores
with ungraded samples (hand-derived), retention with a protected best, best_so_far on resume, the config checks,
and the order in which a sleeping engine is woken.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, TASK_KWARGS
from trainer import checkpoint as ckpt
from trainer.config import ConfigError, load_config, val_metric_names, validation_warnings
from trainer.fsdp import Dist
from trainer.train import main as train_main, train
from trainer.validate import BEFORE, Selection, is_due, samples_dir
from scoring.benchmarks.protocol import generation_settings, sample_seed, scores
from scoring.benchmarks import get_benchmark


def _overrides(out: Path, policy, **extra) -> list[str]:
    base = {"output_dir": str(out), "run_name": "run", "model": str(policy), "task": "addition",
            "task_kwargs": json.dumps(TASK_KWARGS), "prompts_per_step": 8, "samples_per_prompt": 4,
            "max_response_tokens": 32, "micro_batch_size": 32, "lr": 1e-4, "total_steps": 4, "progress": False,
            "deterministic": True, "save_every": 0, "val_benchmarks": "addition", "val_every": 2, "val_n": 4,
            "val_limit": 16}
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --------------------------------------------------------------------------------------------------------------
# pure pieces

def test_validated_steps_count_as_save_every_and_include_the_last():
    assert [s for s in range(5) if is_due(s, val_every=2, total_steps=5)] == [1, 3, 4]
    assert [s for s in range(6) if is_due(s, val_every=3, total_steps=6)] == [2, 5]
    assert [s for s in range(4) if is_due(s, val_every=1, total_steps=4)] == [0, 1, 2, 3]
    assert not any(is_due(s, val_every=0, total_steps=5) for s in range(5))


def test_scores_leave_ungraded_samples_out_and_count_them():
    # A: 2 of 3 graded correct (one grader_error); B: nothing graded; C: 1 of 4
    verdicts = [["pass", "wrong_answer", "grader_error", "pass"], ["grader_error", "timeout"],
                ["wrong_answer", "wrong_answer", "no_answer", "pass"]]
    correct = [[True, False, False, True], [False, False], [False, False, False, True]]
    s = scores(verdicts, correct)
    assert (s["problems"], s["n_min"], s["ungraded"], s["ungraded_problems"]) == (2, 3, 3, 1)
    assert s["avg"] == pytest.approx((2 / 3 + 1 / 4) / 2)            # 0.458333
    assert sorted(s["pass"]) == [1, 2, 3]                             # k_grid(3): up to the fewest graded samples
    assert s["pass"][1] == pytest.approx(s["avg"])
    assert s["pass"][2] == pytest.approx((1.0 + (1 - 3 / 6)) / 2)     # C: 1 - C(3,2)/C(4,2)
    assert s["pass"][3] == pytest.approx((1.0 + (1 - 1 / 4)) / 2)     # C: 1 - C(3,3)/C(4,3)
    empty = scores([["grader_error"]], [[False]])
    assert math.isnan(empty["avg"]) and empty["pass"] == {} and empty["ungraded"] == 1


def test_the_shared_protocol_is_eval_runs():
    bench = get_benchmark("aime24")
    assert generation_settings(bench) == {"n": 32, "temperature": 0.6, "top_p": 0.95, "top_k": 0, "max_tokens": 4096,
                                          "template": "qwen-math"}
    assert generation_settings(bench, top_k=-1)["top_k"] == 0 and generation_settings(bench, top_k=20)["top_k"] == 20
    got = generation_settings(bench, n=4, max_tokens=3072, template="r1")
    assert (got["n"], got["temperature"], got["max_tokens"], got["template"]) == (4, 0.6, 3072, "r1")
    import zlib
    assert sample_seed(0, "aime24", "7", 3) == zlib.crc32(b"0:aime24:7:3")
    from eval.inputs import file_settings
    fs = file_settings(bench, "/m", "m", n=None, temperature=None, top_p=None, max_tokens=3072, template=None,
                       seed=0)
    assert {k: fs[k] for k in ("n", "temperature", "top_p", "top_k", "max_tokens", "template")} == \
        generation_settings(bench, max_tokens=3072)


def test_selection_reads_a_metrics_line():
    sel = Selection("mean_avg", ("val/aime24/avg@32", "val/aime25/avg@32"))
    assert sel.value({"val/aime24/avg@32": 0.4, "val/aime25/avg@32": 0.2}) == pytest.approx(0.3)
    assert sel.value({"val/aime24/avg@32": 0.4}) is None
    assert sel.value({"val/aime24/avg@32": 0.4, "val/aime25/avg@32": float("nan")}) is None
    assert Selection("val/aime24/pass@8", ()).value({"val/aime24/pass@8": 0.7}) == 0.7


# --------------------------------------------------------------------------------------------------------------
# retention and best_so_far on a synthetic run folder

def _fake_run(root: Path, steps: list[int], values: dict[int, float]) -> Path:
    run = root / "run"
    for s in steps:
        d = ckpt.checkpoint_dir(run, s)
        (d / "trainer_state").mkdir(parents=True)
        (d / "config.json").write_text("{}")
    lines = [{"step": BEFORE, "val/a/avg@4": 0.9}] + [{"step": s, **({"val/a/avg@4": values[s]} if s in values else {})}
                                                     for s in range(max(steps) + 1)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    return run


def test_retention_keeps_the_best_besides_the_newest(tmp_path):
    run = _fake_run(tmp_path, [1, 3, 5, 7], {})
    ckpt.prune(run, keep=1, keep_resume=1, protect={3})
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000003", "step_000007"]
    # the protected best keeps its model, not its resume state (12 B/param): only the newest resumes
    assert not (ckpt.checkpoint_dir(run, 3) / "trainer_state").exists()
    assert (ckpt.checkpoint_dir(run, 7) / "trainer_state").exists()


def test_best_so_far_is_the_first_argmax_with_a_checkpoint_and_rewrites_a_stale_record(tmp_path):
    # step 5 ties step 3 (the earlier wins); step 6 is higher but has no checkpoint; -1 (before training) is none
    run = _fake_run(tmp_path, [1, 3, 5], {1: 0.25, 3: 0.5, 5: 0.5, 6: 0.75})
    sel = Selection("mean_avg", ("val/a/avg@4",))
    ckpt.write_best(run, ckpt.best_record(6, "mean_avg", 0.75))   # a record from a branch resumed away from
    best = ckpt.best_so_far(run, sel, before_step=7)
    assert best == {"step": 3, "metric": "mean_avg", "value": 0.5, "checkpoint": "step_000003"}
    assert ckpt.read_best(run) == best
    assert os.readlink(run / "checkpoints" / "best") == "step_000003"   # relative
    assert (run / "checkpoints" / "best").resolve() == ckpt.checkpoint_dir(run, 3).resolve()
    assert ckpt.best_so_far(run, sel, before_step=2)["step"] == 1       # resumed from step 1: only steps 0..1 count
    assert ckpt.best_so_far(run, sel, before_step=1) is None            # none validated yet: record removed
    assert not (run / "checkpoints" / "best").is_symlink() and ckpt.read_best(run) is None


# --------------------------------------------------------------------------------------------------------------
# config

@pytest.mark.parametrize("extra, message", [
    ({"val_benchmarks": "aime99"}, "val_benchmarks: unknown benchmark 'aime99'; choose from: aime24, aime25"),
    ({"val_n": 0}, "val_n must be >= 1"),
    ({"val_benchmarks": "[]"}, "val_benchmarks is empty"),
    ({"select_metric": "val/addition/avg@32"}, "select_metric='val/addition/avg@32' is not a metric validation logs; "
                                               "choose mean_avg (the mean avg@n over val_benchmarks) or one of: "
                                               "val/addition/avg@4, val/addition/pass@1, val/addition/pass@2, "
                                               "val/addition/pass@4"),
    ({"ignore_eos": True}, "ignore_eos=true samples every validation response"),
    ({"val_limit": -1}, "val_limit must be >= 0"),
])
def test_config_refuses_validation_it_cannot_run(tmp_path, extra, message):
    with pytest.raises(ConfigError, match=None) as e:
        load_config(None, _overrides(tmp_path, "tiny:1m", **extra))
    assert message in str(e.value)


def test_select_metric_names_and_warnings(tmp_path):
    cfg = load_config(None, _overrides(tmp_path, "tiny:1m", select_metric="val/addition/pass@4"))
    assert val_metric_names(cfg) == ["val/addition/avg@4", "val/addition/pass@1", "val/addition/pass@2",
                                 "val/addition/pass@4"]
    off = load_config(None, _overrides(tmp_path, "tiny:1m", val_every=0))
    assert validation_warnings(off) == ["val_benchmarks=['addition'] but val_every=0 and val_before_train=false: "
                                        "the run never validates (set val_every=N to score every N-th step)"]


def test_an_unknown_benchmark_is_one_line_and_exit_2(tmp_path, capsys):
    code = train_main(_overrides(tmp_path, "tiny:1m", val_benchmarks="aime99") + ["--dry-run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: config: val_benchmarks: unknown benchmark 'aime99'")


def test_the_dry_run_loads_the_validation_problems(tmp_path, capsys):
    code = train_main(_overrides(tmp_path, "tiny:1m", val_limit=0) + ["--dry-run"])
    err = capsys.readouterr().err
    assert code == 0 and "OK   validation: addition: 200 problems x 4 samples" in err


# --------------------------------------------------------------------------------------------------------------
# the engine: validation wakes it with the step's weights, and the next step does not sync again

class SleepyEngine:
    """The HF engine behind vLLM's sleep-mode contract: generate refuses while asleep; update_weights wakes."""

    def __init__(self, inner, log):
        self.inner, self.log, self.asleep = inner, log, False

    def generate(self, prompts, **kw):
        assert not self.asleep, "generate on a sleeping engine"
        tag = "val" if isinstance(kw["max_new_tokens"], int) else "gen"   # validation passes one budget
        if not self.log or self.log[-1] != tag:
            self.log.append(tag)
        return self.inner.generate(prompts, **kw)

    def update_weights(self, model):
        self.asleep = False
        self.log.append("sync")
        self.inner.update_weights(model)

    def sleep(self):
        self.asleep = True
        self.log.append("sleep")


def test_validation_wakes_the_sleeping_engine_and_the_next_step_reuses_its_weights(tmp_path):
    from inference import make_sampler
    log: list[str] = []

    def builder(model, tokenizer, **kw):
        return SleepyEngine(make_sampler(model, tokenizer, **kw), log)

    cfg = load_config(None, _overrides(tmp_path, "tiny:1m", total_steps=3, val_before_train=True, val_n=2,
                                       val_limit=4, dynamic_sampling=False, log_rollouts=False, prompts_per_step=4,
                                       max_response_tokens=16, val_max_tokens=16))
    train(cfg, Dist(), sampler_builder=builder)
    assert log == ["sync", "val",            # before training
                   "gen", "sleep",           # step 0: the engine already holds these weights
                   "sync", "gen", "sleep",   # step 1
                   "sync", "val",            # validation of step 1 (due: (1 + 1) % 2 == 0), after its update
                   "gen", "sleep",           # step 2
                   "sync", "val"]            # the last step is validated


# --------------------------------------------------------------------------------------------------------------
# end to end on the session's supervised policy

@pytest.fixture(scope="module")
def validated_run(tmp_path_factory, sft_policy_dir):
    out = tmp_path_factory.mktemp("val")
    # lr 1e-3 overshoots: the policy gets worse, then partly recovers (on the machines measured so far the best is
    # neither the first validated step nor the last; test_retention_keeps_the_best_besides_the_newest pins that case)
    cfg = load_config(None, _overrides(out, sft_policy_dir, total_steps=6, val_before_train=True, keep_checkpoints=1,
                                       lr=1e-3))
    t0 = time.perf_counter()
    run = train(cfg, Dist())
    return run, time.perf_counter() - t0


# The values themselves depend on the CPU's float kernels (an AVX-512 Xeon and an AMD EPYC sample different tokens
# from the same weights), so nothing here pins them: validation must equal a separate eval.run of the same
# checkpoint, and the best must be the argmax of what validation wrote.


def _best_step(metrics) -> tuple[int, float]:
    trained = [(m["step"], m["val/select"]) for m in metrics if "val/select" in m and m["step"] >= 0]
    top = max(v for _, v in trained)
    return min(s for s, v in trained if v == top), top   # the first step reaching the highest value


def test_validation_equals_a_separate_eval_run_of_the_checkpoint(validated_run, tmp_path):
    from eval.config import EvalConfig
    from eval.run import run_eval
    run, wall = validated_run
    val = {m["step"]: m for m in _metrics(run) if "val/select" in m}
    assert sorted(val) == [BEFORE, 1, 3, 5]
    for m in val.values():   # correct of 16 problems x 4 samples
        assert m["val/select"] == m["val/addition/avg@4"] and 0 <= m["val/select"] <= 1
        assert (m["val/select"] * 64) == pytest.approx(round(m["val/select"] * 64), abs=1e-9)
    best, _ = _best_step(_metrics(run))
    # eval.run of the best checkpoint (the link) and of the last, with n and limit as validation's, everything
    # else eval.run's defaults (the benchmark's temperature, top-p, budget and template; seed 0)
    steps = [best] + ([5] if best != 5 else [])
    models = [str(run / "checkpoints" / "best")] + [str(run / "checkpoints" / f"step_{s:06d}") for s in steps[1:]]
    res = run_eval(EvalConfig(models=models, benchmarks=["addition"], n=4, limit=16, engine="hf",
                              out=str(tmp_path / "eval"), progress=False), log=lambda m: None)
    assert [r["model"] for r in res["reports"]] == [f"run-step_{s:06d}" for s in steps]   # the link resolves
    for report, step in zip(res["reports"], steps):
        assert report["avg"] == pytest.approx(val[step]["val/addition/avg@4"], abs=1e-12)
        ours = _rows(samples_dir(run, step) / "addition.jsonl")
        theirs = _rows(tmp_path / "eval" / report["model"] / "addition.jsonl")
        assert [r["problem_id"] for r in ours] == [r["problem_id"] for r in theirs] and len(ours) == 16
        for a, b in zip(ours, theirs):
            assert (a["prompt"], a["responses"], a["verdicts"], a["correct"], a["answers"], a["finish_reasons"]) == \
                (b["prompt"], b["responses"], b["verdicts"], b["correct"], b["answers"], b["finish_reasons"])
        for key in ("n", "temperature", "top_p", "max_tokens", "template", "seed", "engine", "dtype",
                    "benchmark_version"):
            assert ours[0]["settings"][key] == theirs[0]["settings"][key], key
    share = sum(m["val/seconds"] for m in val.values()) / wall
    print(f"\nvalidation share of wall time on the tiny run: {share:.1%} of {wall:.1f} s")
    assert 0 < share < 1


def test_best_is_the_argmax_and_survives_retention(validated_run):
    run, _ = validated_run
    metrics = _metrics(run)
    want, top = _best_step(metrics)   # the before-training baseline is never a candidate: it has no checkpoint
    best = ckpt.read_best(run)
    name = f"step_{want:06d}"
    assert best == {"step": want, "metric": "mean_avg", "value": pytest.approx(top, abs=1e-12), "checkpoint": name}
    assert (run / "checkpoints" / "best").resolve().name == name
    kept = sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step_"))
    assert kept == sorted({name, "step_000005"})   # keep_checkpoints=1: the newest, and the best
    before = next(m for m in metrics if m["step"] == BEFORE)
    assert set(before) >= {"val/addition/avg@4", "val/addition/pass@4", "val/select", "val/seconds"}
    assert (samples_dir(run, BEFORE) / "addition.jsonl").is_file()
    assert [m["step"] for m in metrics] == [BEFORE, 0, 1, 2, 3, 4, 5]


def test_relay_accepts_the_best_link_as_its_final_checkpoint(validated_run, tmp_path):
    from tsanalysis.config import RelayConfig
    from tsanalysis.relay import run_relay
    run, _ = validated_run
    tables, _, settings = run_relay(RelayConfig(early=str(run / "checkpoints" / "step_000005"),
                                                final=str(run / "checkpoints" / "best"), benchmark="addition", n=2,
                                                max_tokens=16, temperature=1.0, limit=3, engine="hf",
                                                out=tmp_path / "relay"), log=lambda m: None)
    assert (tmp_path / "relay" / "results.jsonl").is_file()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_ranks_validate_exactly_as_one(tmp_path, sft_policy_dir):
    # 15 problems over 2 ranks: blocks of 7 and 8, each rank sampling and grading its own; every sample its own seed
    extra = {"total_steps": 2, "val_before_train": True, "val_limit": 15, "prompts_per_step": 4, "micro_batch_size": 8}
    cfg = load_config(None, _overrides(tmp_path / "one", sft_policy_dir, **extra))
    one = train(cfg, Dist())
    ov = dict(o.split("=", 1) for o in _overrides(tmp_path / "two", sft_policy_dir, **extra))
    env = dict(os.environ, PYTHONPATH=f"{REPO}", OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                          str(free_port()), str(REPO / "tests" / "helpers" / "multirank_worker.py"), json.dumps(ov)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    two = tmp_path / "two" / "run"
    for step in (BEFORE, 1):
        a = _rows(samples_dir(one, step) / "addition.jsonl")
        b = _rows(samples_dir(two, step) / "addition.jsonl")
        assert [(r["problem_id"], r["responses"], r["verdicts"]) for r in a] == \
            [(r["problem_id"], r["responses"], r["verdicts"]) for r in b]
    for m1, m2 in zip(_metrics(one), _metrics(two)):
        for k in m1:
            if k.startswith("val/") and k != "val/seconds":
                assert m1[k] == pytest.approx(m2[k], abs=1e-12), (m1["step"], k)


@pytest.mark.slow
def test_validation_with_the_vllm_engine_equals_eval_run_with_vllm(tmp_path, sft_policy_dir):
    # vLLM's CPU build: the training engine (pushed the step's weights) against eval.run's own engine loaded from
    # the checkpoint's export, both in float32 (the CPU compute dtype)
    res = subprocess.run([sys.executable, str(REPO / "tests" / "helpers" / "val_vllm_worker.py"), str(tmp_path), str(sft_policy_dir)],
                         capture_output=True, text=True, timeout=1200, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads((tmp_path / "result.json").read_text())
    assert "error" not in r, r.get("error")
    assert (r["validated"], r["engine"], r["dtype"], r["eval_dtype"], r["model"]) == \
        ([1], "vllm", "float32", "float32", "run-step_000001")
    assert r["ours"] == r["theirs"] and len(r["ours"]) == 16
    assert r["val_avg"] == r["eval_avg"] and 0 <= r["val_avg"] <= 1   # the value itself depends on the CPU's kernels


def test_console_lines_show_validation(capsys):
    from trainer.tracking import StepLine, validation_line
    before = {"step": BEFORE, "val/addition/avg@4": 11 / 64, "val/addition/pass@4": 0.1875, "val/select": 11 / 64,
              "val/seconds": 0.5}
    assert validation_line(before) == "validation before training: addition/avg@4 17.2%  select 17.2%  (0.5 s)"
    StepLine(total=6).log(before, BEFORE)   # a line with no training step: only the validation line
    assert capsys.readouterr().err == validation_line(before) + "\n"
    after = {**before, "step": 3}
    assert validation_line(after).startswith("validation after step 4: ")


@pytest.mark.slow   # two launches (~2 s)
def test_a_resume_keeps_the_best_so_far_and_may_change_the_validation_fields(tmp_path):
    common = dict(val_n=2, val_limit=4, dynamic_sampling=False, log_rollouts=False, keep_checkpoints=0,
                  prompts_per_step=4, max_response_tokens=16, val_max_tokens=16)
    run = train(load_config(None, _overrides(tmp_path, "tiny:1m", total_steps=2, **common)), Dist())   # validates 1
    assert [m["step"] for m in _metrics(run) if "val/select" in m] == [1] and ckpt.read_best(run)["step"] == 1
    ckpt.write_best(run, ckpt.best_record(1, "mean_avg", 0.9))   # a stale record: the resume re-derives the best
    # total_steps and val_every are operational: the resume is not refused, and validates 2 and 3 (every step now)
    train(load_config(None, _overrides(tmp_path, "tiny:1m", total_steps=4, val_every=1, **common)), Dist())
    metrics = _metrics(run)
    assert [m["step"] for m in metrics] == [0, 1, 2, 3]
    values = {m["step"]: m["val/select"] for m in metrics if "val/select" in m}
    assert sorted(values) == [1, 2, 3]
    want = min(s for s, v in values.items() if v == max(values.values()))
    assert ckpt.read_best(run)["step"] == want and ckpt.read_best(run)["value"] == values[want]
    assert (run / "checkpoints" / "best").resolve().name == f"step_{want:06d}"
    history = [json.loads(line) for line in (run / "config_history.jsonl").read_text().splitlines()]
    assert history[-1]["changed"]["val_every"] == {"was": 2, "now": 1}


def test_a_prompt_that_does_not_fit_the_engine_stops_before_step_0(tmp_path, capsys):
    # the tiny model holds 1024 positions (inference.tiny.MAX_POSITIONS): 8-character prompts + 1020 tokens do not fit
    code = train_main(_overrides(tmp_path, "tiny:1m", val_max_tokens=1020))
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and err.startswith("error: val_benchmarks: addition's longest prompt is ")
    assert "more than the engine's 1024" in err and "lower val_max_tokens to " in err
    assert not (tmp_path / "run" / "config.yaml").exists() and not (tmp_path / "run" / "metrics.jsonl").exists()

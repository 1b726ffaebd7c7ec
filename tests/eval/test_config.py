"""eval's one config object: a preset, the flags and key=value overrides merge into the same ``EvalConfig`` the flags
alone give; bad choices, types and keys are one line and exit 2, naming the field (and the file) and the way out."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from contracts.config import ConfigError, choices
from contracts.samples import check_settings
from contracts.settings import SettingsMismatch
from eval import run
from eval.config import EvalConfig, load_eval_config, validate
from inference.names import ENGINES, EngineName
from scoring.templates import TEMPLATES

REPO = Path(__file__).resolve().parents[2]
FLAGS = ["--model", "runs/a/checkpoints/step_000010", "--model", "Qwen/Qwen2.5-Math-7B", "--name", "a", "--name",
         "q", "--benchmarks", "aime24,math500", "--n", "4", "--temperature", "0.6", "--max-tokens", "64",
         "--engine", "hf", "--template", "r1", "--lcb-release", "v6", "--no-progress", "--allow-ungraded"]


def _fail(argv, capsys) -> str:
    """main's one-line error for ``argv``: exit status 2, the line returned."""
    with pytest.raises(SystemExit) as e:
        run.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == run.EXIT_INPUT_ERROR == 2 and err.count("\n") == 1, err
    return err.rstrip("\n")


def test_preset_with_flags_and_overrides_equals_the_flags_alone(tmp_path):
    alone = run.parse_config(FLAGS)
    assert alone == EvalConfig(models=["runs/a/checkpoints/step_000010", "Qwen/Qwen2.5-Math-7B"], names=["a", "q"],
                               benchmarks=["aime24", "math500"], n=4, temperature=0.6, max_tokens=64, engine="hf",
                               template="r1", lcb_release="v6", progress=False, allow_ungraded=True)
    preset = tmp_path / "p.yaml"
    preset.write_text("benchmarks: [aime24, math500]\nn: 32\ntemperature: 1.0\nmax_tokens: 64\ntemplate: raw\n"
                      "models: [somebody/else]\n")
    mixed = run.parse_config(["--config", str(preset), "--model", "runs/a/checkpoints/step_000010", "--model",
                              "Qwen/Qwen2.5-Math-7B", "--n", "8", "n=4", "temperature=0.6", "engine=hf",
                              "--template", "r1", "names=[a, q]", "lcb_release=v6", "progress=false",
                              "--allow-ungraded"])
    assert mixed == alone
    # precedence: the file < a flag < key=value, whatever their order on the line
    assert run.parse_config(["--config", str(preset), "n=2", "--n", "8"]).n == 2
    assert run.parse_config(["--config", str(preset), "--n", "8"]).n == 8
    assert run.parse_config(["--config", str(preset)]).n == 32
    assert run.parse_config(["--config", str(preset)]).models == ["somebody/else"]
    assert run.parse_config(["--config", str(preset), "template=null"]).template is None


def test_every_preset_loads_and_validates():
    presets = sorted((REPO / "eval" / "configs").glob("*.yaml"))
    assert [p.name for p in presets] == ["deepseek-r1-distill-qwen-1.5b.yaml", "paper_code.yaml", "paper_math.yaml",
                                         "qwen2.5-math-7b.yaml", "qwen3-4b-thinking-2507.yaml"]
    math = load_eval_config(REPO / "eval/configs/paper_math.yaml", ["models=[m]"])
    validate(math)
    # the paper's table: its benchmarks and avg@32; the sampling settings are the backbone's profile's
    assert (math.benchmarks, math.n, math.profile, math.temperature, math.max_tokens) == (
        ["aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench"], 32, None, None, None)
    code = load_eval_config(REPO / "eval/configs/paper_code.yaml", ["models=[m]"])
    validate(code)
    assert (code.benchmarks, code.n, code.profile, code.template, code.top_k, code.max_tokens) == (
        ["livecodebench"], 32, "qwen3-4b-thinking-2507", "lcb", 20, 16384)
    for p in presets:
        validate(load_eval_config(p, ["models=[m]", "benchmarks=[addition]"]))


def test_a_bad_choice_is_one_line_naming_the_field_and_its_choices(tmp_path, capsys):
    base = ["--model", "m", "--benchmarks", "addition", "--out", str(tmp_path / "o")]
    assert _fail(base + ["--engine", "vlm"], capsys) == \
        "error: config field 'engine' must be one of hf, vllm, auto; got 'vlm' (did you mean 'vllm'?)"
    assert _fail(base + ["template=qwen_math"], capsys) == \
        "error: config field 'template' must be one of raw, qwen-math, qwen-boxed, r1, lcb; got 'qwen_math' " \
        "(did you mean 'qwen-math'?)"
    preset = tmp_path / "bad.yaml"
    preset.write_text("dtype: bf16\n")
    assert _fail(base + ["--config", str(preset)], capsys) == \
        f"error: {preset}: config field 'dtype' must be one of auto, float32, bfloat16, float16; got 'bf16' " \
        "(did you mean 'bfloat16'?)"
    assert _fail(base + ["--n", "many"], capsys) == "error: config field 'n' expects int, got 'many' (str)"
    assert not (tmp_path / "o").exists()


def test_an_unknown_key_gets_a_suggestion(tmp_path, capsys):
    base = ["--model", "m", "--benchmarks", "addition", "--out", str(tmp_path / "o")]
    assert _fail(base + ["max_token=5"], capsys) == \
        "error: command line: unknown config key(s) 'max_token' (did you mean 'max_tokens'?); see eval/config.py " \
        "(or python -m eval.run --help) for the fields"
    preset = tmp_path / "p.yaml"
    preset.write_text("benchmark: [addition]\n")
    assert _fail(["--config", str(preset), "--model", "m"], capsys) == \
        f"error: {preset}: unknown config key(s) 'benchmark' (did you mean 'benchmarks'?); see eval/config.py " \
        "(or python -m eval.run --help) for the fields"
    assert _fail(base + ["--config", str(tmp_path / "none.yaml")], capsys) == \
        f"error: config file '{tmp_path / 'none.yaml'}' does not exist (presets live in eval/configs/)"
    assert not (tmp_path / "o").exists()


def test_cross_field_checks_name_the_field():
    ok = EvalConfig(models=["m"], benchmarks=["addition"])
    validate(ok)
    cases = {"must be one of hf, vllm, auto; got 'vlm'": dict(engine="vlm"),   # built in Python: no coercion
             r"no model: give --model": dict(models=[]),
             r"--name given 2 times for 1 --model": dict(names=["a", "b"]),
             r"--max-tokens must be >= 1 \(max_tokens=0\)": dict(max_tokens=0),
             r"--top-p must lie in \(0, 1\] \(top_p=1.5\)": dict(top_p=1.5),
             r"--grade-timeout must be > 0 seconds \(grade_timeout=0\)": dict(grade_timeout=0),
             r"--lcb-release .* select LiveCodeBench problems": dict(lcb_release="v6"),
             r"unknown benchmark 'gsm9k'; choose from: aime24, ": dict(benchmarks=["gsm9k"])}
    for match, change in cases.items():
        with pytest.raises(ConfigError, match=match):
            validate(EvalConfig(**{**vars(ok), **change}))


def test_choice_fields_are_typed_once():
    assert ENGINES == typing.get_args(EngineName) == choices(EvalConfig, "engine") == ("hf", "vllm", "auto")
    assert choices(EvalConfig, "template") == tuple(TEMPLATES)
    help_text = run.build_parser().format_help()
    assert "--engine {hf,vllm,auto}" in help_text and "--template {raw,qwen-math,qwen-boxed,r1,lcb}" in help_text
    assert "--config FILE.yaml < the flags above < key=value overrides" in help_text


def test_a_results_file_with_other_settings_names_the_file_the_problem_and_the_fix(tmp_path):
    rows = [{"problem_id": "p1", "settings": {"model": "m", "n": 4, "seed": 0}}]
    check_settings(tmp_path / "x.jsonl", rows, {"model": "m", "n": 4, "seed": 0, "engine": "hf"})   # not checked
    with pytest.raises(SettingsMismatch) as e:
        check_settings(tmp_path / "x.jsonl", rows, {"model": "m", "n": 8, "seed": 1})
    assert str(e.value) == (f"{tmp_path / 'x.jsonl'} (problem 'p1') was written with other settings (n: recorded 4, "
                            f"now 8; seed: recorded 0, now 1); use a new --out directory, or delete the file to start "
                            f"over")

"""The configs of ``tsanalysis relay`` and ``tsanalysis support`` (tsanalysis.config): a bad field is one ``error:``
line naming its flag, exit 2, before any file is read or model loaded; ``--config FILE`` is a flat YAML of the
fields under the flags; a config built in Python is validated the same way by ``run_relay`` / ``support_tables``.
No checkpoint is needed: every refusal here comes first."""

import dataclasses

import pytest
import yaml

import inference
from contracts.config import to_dict
from tsanalysis import relay
from tsanalysis.cli import build_parser, main
from tsanalysis.config import RelayConfig, SupportConfig, from_flags, validate_relay, validate_support
from tsanalysis.errors import RelayError, UsageError
from tsanalysis.support import support_tables


@pytest.fixture(autouse=True)
def no_model_loads(monkeypatch):
    monkeypatch.setattr(inference, "load_policy", lambda *a, **k: pytest.fail("a model was loaded"))


def _error(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


RELAY = ["relay", "--early", "a", "--final", "b", "--benchmarks", "addition"]


@pytest.mark.parametrize("flags,line", [
    (["--cut", "1.5"], "--cut must lie in [0, 1], got 1.5"),
    (["--n", "0"], "--n must be >= 1, got 0"),
    (["--batch-problems", "0"], "--batch-problems must be >= 1, got 0"),
    (["--limit", "0"], "--limit must be >= 1, got 0"),
    (["--max-tokens", "0"], "--max-tokens must be >= 1, got 0"),
    (["--temperature", "-1"], "--temperature must be >= 0, got -1.0 (0 is greedy)"),
    (["--top-p", "0"], "--top-p must lie in (0, 1], got 0.0"),
    (["--top-k", "-3"], "--top-k: top_k must be an integer >= 1, or 0 (or -1) for off; got -3"),
    (["--benchmarks", "aime24,aime25"], "--benchmarks aime24,aime25: the relay takes one benchmark (a relay folder "
                                        "holds one); run it once per benchmark, each with its own --out"),
])
def test_a_bad_relay_flag_is_one_line_naming_it(flags, line, tmp_path, capsys):
    assert main(RELAY + flags + ["--out", str(tmp_path / "o")]) == 2
    assert _error(capsys) == [f"error: {line}"]
    assert not (tmp_path / "o").exists()


def test_missing_checkpoints_or_benchmark_name_the_flags(capsys):
    assert main(["relay", "--benchmarks", "addition"]) == 2
    assert _error(capsys) == ["error: relay needs --early CKPT_A and --final CKPT_B (the two checkpoints; early: and "
                              "final: in a --config file)"]
    assert main(["relay", "--early", "a", "--final", "b"]) == 2
    [line] = _error(capsys)
    assert line.startswith("error: relay needs --benchmarks NAME")


@pytest.mark.parametrize("flags", [["--engine", "tpu"], ["--template", "nope"], ["--n", "two"]])
def test_argparse_refuses_a_choice_or_type_before_the_config(flags, capsys):
    with pytest.raises(SystemExit) as e:
        main(RELAY + flags)
    assert e.value.code == 2 and f"argument {flags[0]}" in capsys.readouterr().err


def test_a_config_built_in_python_is_validated_with_the_flag_named(tmp_path):
    ok = dict(early="a", final="b", benchmark="addition", out=str(tmp_path / "o"))
    for bad, msg in ((dict(engine="tpu"), "--engine: engine must be one of hf, vllm, auto; got 'tpu'"),
                     (dict(template="nope"), "--template: template must be one of raw, qwen-math"),
                     (dict(n=0), "--n must be >= 1, got 0"),
                     (dict(early=None), "relay needs --early CKPT_A and --final CKPT_B")):
        with pytest.raises(RelayError) as e:
            relay.run_relay(RelayConfig(**{**ok, **bad}), log=lambda m: None)
        assert str(e.value).startswith(msg), str(e.value)
    assert not (tmp_path / "o").exists()
    validate_relay(RelayConfig(**ok))   # the defaults are valid


def test_config_file_is_under_the_flags(tmp_path, capsys):
    cfg_file = tmp_path / "relay.yaml"
    early = str(tmp_path / "no-such-checkpoint")
    cfg_file.write_text(yaml.safe_dump({"early": early, "final": "b", "benchmark": "addition", "cut": 1.5, "n": 4}))
    assert main(["relay", "--config", str(cfg_file)]) == 2                    # the file's cut
    assert _error(capsys) == ["error: --cut must lie in [0, 1], got 1.5"]
    args = build_parser().parse_args(["relay", "--config", str(cfg_file), "--cut", "0.25", "--top-k", "5"])
    cfg = from_flags(RelayConfig, args)                                        # the flags win, the file fills in
    assert (cfg.early, cfg.benchmark, cfg.n, cfg.cut, cfg.top_k, cfg.temperature) == (early, "addition", 4, 0.25, 5,
                                                                                      1.0)
    # past the config, the next check is the checkpoints' files: the file's early is read
    assert main(["relay", "--config", str(cfg_file), "--cut", "0.25", "--out", str(tmp_path / "o")]) == 2
    [line] = _error(capsys)
    assert line.startswith(f"error: --early {early}: no such model folder")
    # an unknown key (with the close match) and a value of the wrong type name the file and the field
    cfg_file.write_text("early: a\nfinal: b\ncutt: 0.5\n")
    assert main(["relay", "--config", str(cfg_file)]) == 2
    assert _error(capsys) == [f"error: {cfg_file}: unknown config key(s) 'cutt' (did you mean 'cut'?); see "
                              f"tsanalysis/config.py (or the command's --help) for the fields"]
    cfg_file.write_text("n: many\n")
    assert main(["relay", "--config", str(cfg_file)]) == 2
    assert _error(capsys) == [f"error: {cfg_file}: config field 'n' expects int, got 'many' (str)"]


def test_every_field_has_a_flag_with_its_help():
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices
    for name, cls in (("relay", RelayConfig), ("support", SupportConfig)):
        dests = {a.dest: a for a in sub[name]._actions}
        for f in dataclasses.fields(cls):
            assert f.name in dests and dests[f.name].help.startswith(f.metadata["help"]), (name, f.name)
    # a config read back from its own dict is the same config (what a --config file written from one holds)
    cfg = RelayConfig(early="a", final="b", benchmark="addition", n=4, top_k=2)
    args = build_parser().parse_args(["relay"] + [x for k, v in to_dict(cfg).items() if v not in (None, False)
                                                  for x in (f"--{k.replace('_', '-')}", str(v))])
    assert from_flags(RelayConfig, args) == cfg


@pytest.mark.parametrize("flags,line", [
    (["--likelihood-samples", "0"], "--likelihood-samples must be >= 1, got 0"),
    (["--n-boot", "0"], "--n-boot must be >= 1, got 0"),
    (["--models", "a,b,a"], "--models names a model twice: a,b,a"),
    (["--models", "a,relay"], "--models names relay: give its folder with --relay DIR"),
])
def test_a_bad_support_flag_is_one_line_naming_it(flags, line, tmp_path, capsys):
    assert main(["support", "--eval-dir", str(tmp_path)] + flags + ["--out", str(tmp_path / "o")]) == 2
    assert _error(capsys) == [f"error: {line}"]
    assert not (tmp_path / "o").exists()


def test_support_needs_an_eval_dir_and_validates_a_python_config(tmp_path, capsys):
    assert main(["support", "--models", "a,b"]) == 2
    assert _error(capsys) == ["error: support needs --eval-dir DIR (python -m eval.run's --out folder; eval_dir: in "
                              "a --config file)"]
    with pytest.raises(UsageError, match=r"^--dtype: dtype must be one of float32, bfloat16, float16; got 'int8'$"):
        support_tables(SupportConfig(eval_dir=str(tmp_path), dtype="int8"), log=lambda m: None)
    with pytest.raises(UsageError, match="^--models names a model twice: a,a$"):
        validate_support(SupportConfig(eval_dir=str(tmp_path), models=["a", "a"]))
    cfg_file = tmp_path / "support.yaml"
    cfg_file.write_text(f"eval_dir: {tmp_path / 'missing'}\nmodels: [a, b]\n")
    assert main(["support", "--config", str(cfg_file)]) == 2                  # the file's folder is the one read
    [line] = _error(capsys)
    assert line.startswith(f"error: --eval-dir {tmp_path / 'missing'}: no such folder")


# ---- the checks tsanalysis shares with eval and the trainer, one home: inference.hub ------------------------------
def test_context_overflow_and_check_context_by_hand():
    from inference.hub import ContextError, check_context, context_overflow

    prompts = {"a": [1] * 10, "b": [1] * 30, "c": [1] * 20}
    assert context_overflow(prompts, 10, 40) is None and context_overflow(prompts, 11, None) is None
    assert context_overflow({}, 10**6, 1) is None
    over = context_overflow(prompts, 11, 40)          # the longest prompt, b: 30 + 11 = 41 > 40
    assert (over.problem_id, over.prompt_tokens, over.total, over.limit, over.room) == ("b", 30, 41, 40, 10)
    check_context("--model m: x", prompts, 10, (40, "max_position_embeddings"))
    with pytest.raises(ContextError) as e:
        check_context("--model m: x", prompts, 11, (40, "max_position_embeddings"), where="m/config.json")
    assert str(e.value) == ("--model m: x: the longest prompt (problem 'b') of 30 tokens + max_tokens 11 = 41 > the "
                            "model's context 40 (max_position_embeddings in m/config.json); lower --max-tokens to <= 10")
    with pytest.raises(ContextError, match=r"= 40 > max_context 35; lower --max-tokens to <= 5, or a hint$"):
        check_context("w", prompts, 10, (64, "n_positions"), cap=35, hint=", or a hint")   # the smaller limit wins
    with pytest.raises(ContextError, match="the prompt alone fills it"):
        check_context("w", prompts, 1, (30, "n_positions"))

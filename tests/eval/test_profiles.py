"""Evaluation settings per backbone (#23 item 2): the three profiles' values and the source beside each, their
place in the config's layers, top-k in both engines' sampling (k = 1 is greedy, nothing outside the k most likely,
the order of transformers' warpers), top-k recorded in eval's and the relay's settings (a file without it reads as
off), and a prompt plus budget beyond the model's context refused before anything is generated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from contracts.config import ConfigError
from eval import run
from eval.config import PROFILES, load_eval_config, profile_path, validate
from inference.hub import model_context
from inference.hf import HFSampler, sample_next_token
from inference.protocol import TOP_K_OFF, resolve_top_k
from inference.tiny import save_tiny
from scoring.benchmarks import get_benchmark
from tsanalysis.cli import main as relay_cli
from tsanalysis.config import RelayConfig
from tsanalysis.errors import RelayError
from tsanalysis.relay import run_relay

REPO = Path(__file__).resolve().parents[2]
EOS, PAD = 2, 0
ALL_PROFILES = "qwen2.5-math-7b, deepseek-r1-distill-qwen-1.5b, qwen3-4b-thinking-2507"


@pytest.fixture(scope="module", autouse=True)
def _threads():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _fail(argv, capsys) -> str:
    """main's one-line error for ``argv``: exit status 2, the line returned."""
    with pytest.raises(SystemExit) as e:
        run.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == run.EXIT_INPUT_ERROR == 2 and err.count("\n") == 1, err
    return err.rstrip("\n")


# ---- the profiles ----------------------------------------------------------------------------------------------

# (template, temperature, top_p, top_k, max_tokens, max_context), each from the source its file names
EXPECTED = {"qwen2.5-math-7b": ("qwen-math", 0.6, 0.95, 0, 3072, 4096),
            "deepseek-r1-distill-qwen-1.5b": ("r1", 0.6, 0.95, 0, 8192, 131072),
            "qwen3-4b-thinking-2507": ("lcb", 0.6, 0.95, 20, 16384, 262144)}
SOURCES = ("§5.1", "huggingface.co", "README", "config.json", "evaluation/", "trainer/configs", "as temperature")


def test_each_profile_holds_its_values_with_a_source_above_each():
    assert list(PROFILES) == list(EXPECTED)
    for name, want in EXPECTED.items():
        cfg = load_eval_config(None, ["models=[m]", "benchmarks=[addition]", f"profile={name}"])
        validate(cfg)
        assert (cfg.template, cfg.temperature, cfg.top_p, cfg.top_k, cfg.max_tokens, cfg.max_context) == want, name
        assert cfg.n is None                                   # avg@32: the paper's, the benchmark's default
        lines = profile_path(name).read_text().splitlines()
        keys = [i for i, line in enumerate(lines) if line and not line.startswith("#")]
        assert len(keys) == 6
        for i in keys:   # the comment block right above each key names where the value comes from
            j = i
            while j > 0 and lines[j - 1].startswith("#"):
                j -= 1
            comment = " ".join(lines[j:i])
            assert j < i and any(s in comment for s in SOURCES), (name, lines[i])
    # the paper states avg@32, not a sampling setting: no profile line says a temperature is the paper's
    for name in PROFILES:
        assert "the paper's temperature" not in profile_path(name).read_text()


def test_profile_under_the_preset_the_flags_and_the_overrides(tmp_path, capsys):
    preset = tmp_path / "p.yaml"
    preset.write_text("benchmarks: [addition]\ntemperature: 1.0\n")
    cfg = run.parse_config(["--profile", "qwen2.5-math-7b", "--model", "m"])
    assert (cfg.temperature, cfg.max_tokens, cfg.max_context, cfg.top_k) == (0.6, 3072, 4096, 0)
    cfg = run.parse_config(["--config", str(preset), "--profile", "qwen2.5-math-7b", "--model", "m"])
    assert (cfg.temperature, cfg.max_tokens) == (1.0, 3072)                 # the preset over the profile
    cfg = run.parse_config(["--config", str(preset), "--profile", "qwen2.5-math-7b", "--temperature", "0.8"])
    assert cfg.temperature == 0.8                                           # a flag over the preset
    cfg = run.parse_config(["temperature=0.7", "--config", str(preset), "--profile", "qwen2.5-math-7b",
                            "--temperature", "0.8"])
    assert cfg.temperature == 0.7                                           # key=value over everything
    named = tmp_path / "named.yaml"
    named.write_text("benchmarks: [livecodebench]\nprofile: qwen3-4b-thinking-2507\n")
    assert run.parse_config(["--config", str(named)]).top_k == 20          # a preset may name the profile
    cfg = run.parse_config(["--config", str(named), "--profile", "deepseek-r1-distill-qwen-1.5b"])
    assert (cfg.template, cfg.top_k, cfg.max_tokens) == ("r1", 0, 8192)     # the command line's profile wins
    cfg = run.parse_config(["--config", str(named), "profile=null"])
    assert (cfg.template, cfg.top_k, cfg.max_tokens) == (None, None, None)  # and null drops it
    assert _fail(["--model", "m", "--benchmarks", "addition", "--profile", "qwen25-math-7b"], capsys) == \
        f"error: config field 'profile' must be one of {ALL_PROFILES}; got 'qwen25-math-7b' (did you mean " \
        f"'qwen2.5-math-7b'?)"
    with pytest.raises(ConfigError, match=r"--top-k must be >= 1, or 0 \(or -1\) for off \(top_k=-2\)"):
        validate(load_eval_config(None, ["models=[m]", "benchmarks=[addition]", "top_k=-2"]))
    with pytest.raises(ConfigError, match=r"--top-k is not passed to lm-eval tasks"):
        validate(load_eval_config(None, ["models=[m]", "lm_eval_tasks=[gsm8k]", "top_k=20"]))


# ---- top-k in the HF engine ------------------------------------------------------------------------------------

def tiny_llama(scale: float = 1.0) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1,
                      eos_token_id=EOS, pad_token_id=PAD)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        m.lm_head.weight.mul_(scale)
    return m


def _prompts():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, 100, (n,), generator=g).tolist() for n in (1, 3, 17, 8, 12, 5)]


def test_top_k_one_is_greedy():
    logits = torch.randn(64, 100, generator=torch.Generator().manual_seed(0)) * 3
    for top_p in (1.0, 0.9, 0.3):
        for temperature in (0.5, 1.0, 1.7):
            got = sample_next_token(logits, temperature=temperature, top_p=top_p, top_k=1,
                                    generator=torch.Generator().manual_seed(1))
            assert torch.equal(got, logits.argmax(-1))
    model, prompts = tiny_llama(), _prompts()
    for fast in (True, False):
        sampler = HFSampler(model, eos_token_id=EOS, pad_token_id=PAD, fast=fast)
        greedy = sampler.generate(prompts, max_new_tokens=12, temperature=0.0)
        k1 = sampler.generate(prompts, max_new_tokens=12, temperature=1.0, top_k=1, seeds=list(range(6)))
        k1_p = sampler.generate(prompts, max_new_tokens=12, temperature=1.3, top_p=0.5, top_k=1, seed=4)
        assert [c.token_ids for c in k1] == [c.token_ids for c in k1_p] == [c.token_ids for c in greedy]
        free = sampler.generate(prompts, max_new_tokens=12, temperature=1.0, seeds=list(range(6)))
        assert sum(a.token_ids != b.token_ids for a, b in zip(free, greedy)) >= 5   # without top-k: not greedy
        assert len(greedy[2].token_ids) == 12 or greedy[2].token_ids[-1] == EOS
    # off is 0, and -1 (vLLM's older spelling) is the same draw
    sampler = HFSampler(model, eos_token_id=EOS, pad_token_id=PAD)
    a, b, c = (sampler.generate(prompts, max_new_tokens=8, temperature=1.0, seed=3, **kw)
               for kw in ({}, {"top_k": 0}, {"top_k": -1}))
    assert [x.token_ids for x in a] == [x.token_ids for x in b] == [x.token_ids for x in c]
    assert (TOP_K_OFF, resolve_top_k(-1), resolve_top_k(0), resolve_top_k(7)) == (0, 0, 0, 7)
    for bad in (-2, 1.5, True, "5"):
        with pytest.raises(ValueError, match="top_k must be an integer >= 1, or 0"):
            sampler.generate(prompts, max_new_tokens=2, top_k=bad)


def test_top_k_never_samples_outside_the_k_most_likely():
    model = tiny_llama(scale=15.0)   # a peaked next-token distribution, so a frequency test has power
    prompt, k, n = [1, 17, 42, 8], 5, 3000
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([prompt])).logits[0, -1].double(), -1)
    top = probs.topk(k).indices
    assert probs[top].sum() < 0.97   # the tokens left out carry mass: sampling outside them would show
    sampler = HFSampler(model, eos_token_id=1000, pad_token_id=PAD, max_batch_size=n)
    drawn = torch.tensor([c.token_ids[0] for c in sampler.generate([prompt] * n, max_new_tokens=1,
                                                                     temperature=1.0, top_k=k, seeds=list(range(n)))])
    assert torch.isin(drawn, top).all() and len(set(drawn.tolist())) == k
    freq = torch.bincount(drawn, minlength=100).double() / n
    renorm = probs[top] / probs[top].sum()
    assert (freq[top] - renorm).abs().max() < 0.03   # 3000 draws: a standard error of at most 0.009


def _implied(logits, *, temperature, top_p, top_k, n=40000):
    """The distribution ``sample_next_token`` draws from, read off a grid of n uniforms per row."""
    b, V = logits.shape
    u = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    rows = []
    for r in range(b):
        tok = sample_next_token(logits[r:r + 1].expand(n, V), temperature=temperature, top_p=top_p, top_k=top_k,
                                u=u)
        rows.append(torch.bincount(tok, minlength=V).double() / n)
    return torch.stack(rows)


def test_top_k_then_top_p_as_transformers_warpers_do():
    from transformers.generation.logits_process import (LogitsProcessorList, TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)
    # hand-derived: p = 0.4, 0.3, 0.2, 0.1; top-k 3 leaves 4/9, 3/9, 2/9, whose top-p 0.75 keeps two: 4/7, 3/7
    # (top-p first would keep three tokens of the original: 0.4 + 0.3 < 0.75)
    hand = _implied(torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log(), temperature=1.0, top_p=0.75, top_k=3)[0]
    assert hand.tolist() == pytest.approx([4 / 7, 3 / 7, 0.0, 0.0], abs=1e-4)
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(2)) * 2
    for temperature, top_p, top_k in ((1.0, 0.9, 10), (0.7, 1.0, 5), (1.3, 0.8, 20), (1.0, 0.95, 50)):
        warp = LogitsProcessorList([TemperatureLogitsWarper(temperature), TopKLogitsWarper(top_k)]
                                   + ([TopPLogitsWarper(top_p)] if top_p < 1 else []))
        ref = torch.softmax(warp(None, logits.clone()).double(), -1)
        got = _implied(logits, temperature=temperature, top_p=top_p, top_k=top_k)
        assert ((got > 0) == (ref > 0)).all(), (temperature, top_p, top_k)     # the same kept tokens
        assert (got - ref).abs().max() < 1e-4, (temperature, top_p, top_k)     # drawn in the same proportions


# ---- the model's context ---------------------------------------------------------------------------------------

def _config(tmp_path, name, cfg) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_model_context_reads_config_json_as_vllm_does(tmp_path):
    cases = {"plain": ({"max_position_embeddings": 4096}, (4096, "max_position_embeddings")),
             "smallest": ({"max_position_embeddings": 2048, "n_positions": 1024}, (1024, "n_positions")),
             "dynamic": ({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
                         (8192, "max_position_embeddings x rope_scaling.factor 2")),
             # YaRN's max_position_embeddings is already the scaled length (vLLM applies no factor to it)
             "yarn": ({"max_position_embeddings": 131072,
                       "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}},
                      (131072, "max_position_embeddings")),
             "multimodal": ({"text_config": {"max_position_embeddings": 32768}}, (32768, "max_position_embeddings")),
             "none": ({"hidden_size": 8}, None)}
    for name, (cfg, want) in cases.items():
        assert model_context(_config(tmp_path, name, cfg)) == want, name
    assert model_context(tmp_path / "missing") is None


@pytest.fixture(scope="module")
def short_model(tmp_path_factory):
    """The tiny char-level model with a config.json of 40 positions (the tokenizer still says 1024)."""
    d = save_tiny(tmp_path_factory.mktemp("short") / "short", "1m")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 40}))
    return d


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny") / "tiny", "1m")


def _addition_prompts(limit: int):
    """(longest prompt's tokens, its problem id) of the first ``limit`` addition problems: the tiny tokenizer has one
    token per character and the addition template is the question as it is."""
    probs = get_benchmark("addition").load()[:limit]
    p = max(probs, key=lambda x: len(x.question))
    return len(p.question), p.id


def test_a_prompt_plus_budget_beyond_the_context_is_refused_before_anything_is_generated(short_model, tmp_path,
                                                                                        capsys, monkeypatch):
    P, pid = _addition_prompts(3)
    out = tmp_path / "o"
    base = ["--model", str(short_model), "--benchmarks", "addition", "--limit", "3", "--n", "2", "--engine", "hf",
            "--out", str(out), "--no-progress"]
    started = []
    real = run.make_generator
    monkeypatch.setattr(run, "make_generator", lambda *a, **k: started.append(1) or real(*a, **k))
    where = short_model / "config.json"
    assert _fail(base + ["--max-tokens", "36"], capsys) == (
        f"error: --model {short_model}: addition: the longest prompt (problem {pid!r}) of {P} tokens + max_tokens 36 "
        f"= {P + 36} > the model's context 40 (max_position_embeddings in {where}); lower --max-tokens to <= "
        f"{40 - P}, or give the backbone's --profile ({ALL_PROFILES})")
    # max_context caps under the model's context, and a profile's own cap (4096) is capped by the model's 40
    assert _fail(base + ["--max-tokens", str(40 - P), "--max-context", "30"], capsys) == (
        f"error: --model {short_model}: addition: the longest prompt (problem {pid!r}) of {P} tokens + max_tokens "
        f"{40 - P} = 40 > max_context 30; lower --max-tokens to <= {30 - P}, or give the backbone's --profile "
        f"({ALL_PROFILES})")
    line = _fail(base + ["--profile", "qwen2.5-math-7b", "template=raw"], capsys)
    assert line.endswith(f"of {P} tokens + max_tokens 3072 = {P + 3072} > the model's context 40 "
                         f"(max_position_embeddings in {where}); lower --max-tokens to <= {40 - P}"), line
    assert not started and not out.exists()        # no engine started, nothing written
    # the budget that fits runs, and its lines record top-k (off)
    assert run.main(base + ["--max-tokens", str(40 - P)]) == 0 and started == [1]
    rows = [json.loads(x) for x in (out / "short" / "addition.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and {r["settings"]["top_k"] for r in rows} == {0}
    assert max(len(x) for r in rows for x in r["responses"]) <= 40 - P


def test_results_record_top_k_and_a_file_without_it_reads_as_off(tiny_model, tmp_path, capsys):
    out = tmp_path / "o"
    base = ["--model", str(tiny_model), "--benchmarks", "addition", "--limit", "2", "--n", "2", "--max-tokens", "8",
            "--engine", "hf", "--out", str(out), "--no-progress"]
    assert run.main(base + ["--top-k", "1", "--temperature", "1.0"]) == 0
    path = out / "tiny" / "addition.jsonl"
    k1 = [json.loads(x) for x in path.read_text().splitlines()]
    assert {r["settings"]["top_k"] for r in k1} == {1}
    assert run.main(base + ["--temperature", "0", "--out", str(tmp_path / "greedy")]) == 0
    greedy = [json.loads(x) for x in (tmp_path / "greedy" / "tiny" / "addition.jsonl").read_text().splitlines()]
    assert [r["responses"] for r in k1] == [r["responses"] for r in greedy]     # top-k 1 is greedy
    # a file written before top-k was recorded: its lines read as top-k off, so an off run resumes it ...
    lines = [json.loads(x) for x in (tmp_path / "greedy" / "tiny" / "addition.jsonl").read_text().splitlines()]
    for r in lines:
        del r["settings"]["top_k"]
    old = tmp_path / "old" / "tiny" / "addition.jsonl"
    old.parent.mkdir(parents=True)
    old.write_text("".join(json.dumps(r) + "\n" for r in lines))
    before = old.read_bytes()
    assert run.main(base + ["--temperature", "0", "--out", str(tmp_path / "old"), "--top-k", "-1"]) == 0
    assert old.read_bytes() == before                                          # nothing to do, nothing appended
    # ... and a run with top-k on is refused, naming the field
    capsys.readouterr()
    line = _fail(base + ["--temperature", "0", "--out", str(tmp_path / "old"), "--top-k", "5"], capsys)
    assert "was written with other settings (top_k: recorded 0, now 5)" in line, line


# ---- the relay -------------------------------------------------------------------------------------------------

def _relay(early, final, out, **kw):
    args = dict(early=str(early), final=str(final), benchmark="addition", n=2, cut=0.5, max_tokens=8, seed=3,
                limit=2, engine="hf", out=out, batch_problems=1)
    return run_relay(RelayConfig(**{**args, **kw}), log=lambda s: None)


def test_relay_checks_the_context_and_records_top_k(short_model, tiny_model, tmp_path):
    P, pid = _addition_prompts(2)
    with pytest.raises(RelayError) as e:
        _relay(short_model, tiny_model, tmp_path / "r0", max_tokens=36)
    assert str(e.value) == (
        f"--early {short_model}: addition: the longest prompt (problem {pid!r}) of {P} tokens + max_tokens 36 = "
        f"{P + 36} > the model's context 40 (max_position_embeddings in {short_model / 'config.json'}); lower "
        f"--max-tokens to <= {40 - P}")
    assert not (tmp_path / "r0").exists()                                       # refused before the folder is claimed
    # the command line's --top-k (tsanalysis relay), and the library call
    assert relay_cli(["relay", "--early", str(tiny_model), "--final", str(tiny_model), "--benchmarks", "addition",
                      "--n", "2", "--max-tokens", "8", "--seed", "3", "--limit", "2", "--engine", "hf",
                      "--batch-problems", "1", "--temperature", "1.0", "--top-k", "1",
                      "--out", str(tmp_path / "k1")]) == 0
    _relay(tiny_model, tiny_model, tmp_path / "greedy", temperature=0.0)
    assert json.loads((tmp_path / "k1" / "relay_settings.json").read_text())["top_k"] == 1
    results = {f: (tmp_path / f / "results.jsonl").read_text() for f in ("k1", "greedy")}
    assert len(results["k1"].splitlines()) == 2 and results["k1"] == results["greedy"]   # top-k 1 is greedy
    with pytest.raises(RelayError, match=r"top_k: recorded 1, now 0"):
        _relay(tiny_model, tiny_model, tmp_path / "k1", temperature=1.0)
    # a folder written before top-k was recorded reads as off
    g = tmp_path / "greedy" / "relay_settings.json"
    g.write_text(json.dumps({k: v for k, v in json.loads(g.read_text()).items() if k != "top_k"}))
    _relay(tiny_model, tiny_model, tmp_path / "greedy", temperature=0.0, top_k=-1)
    with pytest.raises(RelayError, match=r"top_k: recorded 0, now 3"):
        _relay(tiny_model, tiny_model, tmp_path / "greedy", temperature=0.0, top_k=3)

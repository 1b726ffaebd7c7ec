"""Engine choice (inference.engines.resolve_engine): which engine ``engine=auto`` gives on which machine and size."""

import json

import pytest

from inference import resolve_engine
from inference.engines import CPU_VLLM_MIN_PARAMS, _num_params
from inference.tiny import build_model, build_tokenizer


def test_explicit_engines_pass_and_unknown_ones_are_refused():
    assert resolve_engine("hf") == "hf" and resolve_engine("vllm") == "vllm"
    with pytest.raises(ValueError, match="engine must be one of"):
        resolve_engine("sglang")


def test_auto_picks_vllm_on_gpus_and_by_size_on_cpus():
    # vLLM is installed wherever the suite runs (make install), so the rule alone decides
    assert resolve_engine("auto", num_params=10**6, cuda=True) == "vllm"
    assert resolve_engine("auto", num_params=10**6, cuda=False) == "hf"          # vLLM's step overhead dominates
    assert resolve_engine("auto", num_params=CPU_VLLM_MIN_PARAMS, cuda=False) == "vllm"
    assert resolve_engine("auto", cuda=False) == "hf"                            # size unknown: the HF engine


def test_model_size_from_the_module_or_its_config(tmp_path):
    tok = build_tokenizer()
    model = build_model("1m", tok, seed=0)
    exact = sum(p.numel() for p in model.parameters())
    assert _num_params(model=model) == exact
    model.save_pretrained(tmp_path)
    estimate = _num_params(model_path=str(tmp_path))                # from config.json alone, no weights read
    assert abs(estimate - exact) / exact < 0.05
    qwen = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "vocab_size": 151936,
            "num_attention_heads": 14, "num_key_value_heads": 2, "tie_word_embeddings": True}
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "config.json").write_text(json.dumps(qwen))
    # Qwen2.5-0.5B's shapes: 494M parameters (norms and biases, a few hundred thousand, are not counted)
    assert 493e6 < _num_params(model_path=str(tmp_path / "q")) < 495e6
    assert resolve_engine("auto", model_path=str(tmp_path / "q"), cuda=False) == "vllm"

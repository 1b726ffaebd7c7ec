"""inference.tiny: char tokenizer layout and round-trip, tiny Llama sizes, save/reload equivalence."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from inference import tiny

TEXTS = [
    "347+85\n7+5+0=12\n4+8+1=13\n3+0+1=4\n= 432",
    "  leading and trailing spaces  ",
    "double  spaces\n\nand blank lines\n",
    "Make 20 from 8 3 4\n= (8*3)-4",
    "punctuation: !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    "0123456789 ABCxyz",
]


@pytest.fixture(scope="module")
def tok():
    return tiny.build_tokenizer()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny") / "m1"
    tiny.save_tiny(out, "1m", seed=3)
    return out


def test_vocab_layout(tok):
    assert len(tok) == tiny.VOCAB_SIZE == 100
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert tok.convert_tokens_to_ids(["<pad>", "<bos>", "<eos>", "<unk>", "\n", " ", "0", "A", "a", "~"]) == [
        0, 1, 2, 3, 4, 5, 21, 38, 70, 99,
    ]
    # no special tokens added on encode (prompts are tokenized with the defaults in some callers)
    assert tok("ab")["input_ids"] == [70, 71]
    assert tok("ab", add_special_tokens=False)["input_ids"] == [70, 71]


def test_one_token_per_char_and_roundtrip(tok):
    for text in TEXTS:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert len(ids) == len(text)
        assert tok.decode(ids) == text
        assert tok.decode(ids + [tok.eos_token_id, tok.pad_token_id], skip_special_tokens=True) == text


def test_unknown_characters_map_to_unk(tok):
    assert tok("a\té€b", add_special_tokens=False)["input_ids"] == [70, 3, 3, 3, 71]
    assert tok.decode([70, 3, 71], skip_special_tokens=True) == "ab"


def test_reload_gives_same_tokenizer(saved, tok):
    cfg = json.loads((saved / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert json.loads((saved / "config.json").read_text())["model_type"] == "llama"
    reloaded = AutoTokenizer.from_pretrained(saved)
    assert (reloaded.pad_token_id, reloaded.bos_token_id, reloaded.eos_token_id, reloaded.unk_token_id) == (0, 1, 2, 3)
    assert len(reloaded) == 100
    for text in TEXTS + ["a\té€b"]:
        ids = reloaded(text, add_special_tokens=False)["input_ids"]
        assert ids == tok(text, add_special_tokens=False)["input_ids"]
        assert reloaded(text)["input_ids"] == ids
    for text in TEXTS:
        assert reloaded.decode(reloaded(text)["input_ids"], skip_special_tokens=True) == text


def test_reload_gives_identical_logits(saved, tok):
    model = tiny.build_model("1m", tok, seed=3).eval()
    reloaded = AutoModelForCausalLM.from_pretrained(saved).eval()
    assert type(reloaded).__name__ == "LlamaForCausalLM"
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()  # tied
    ids = torch.tensor([tok(t, add_special_tokens=False)["input_ids"][:30] for t in TEXTS[:3]])  # [3, 30]
    with torch.no_grad():
        a, b = model(ids).logits, reloaded(ids).logits  # [3, 30, V]
    assert a.shape == (3, 30, 100)
    assert torch.equal(a, b)
    assert reloaded.generation_config.eos_token_id == 2 and reloaded.generation_config.pad_token_id == 0


@pytest.mark.parametrize(
    "size, lo, hi", [("1m", 0.9e6, 1.2e6), ("2m", 1.8e6, 2.3e6), ("5m", 4.5e6, 5.5e6), ("20m", 18e6, 21e6)]
)
def test_parameter_counts(tok, size, lo, hi):
    config = tiny.model_config(size, tok)
    assert config.max_position_embeddings >= 512 and config.tie_word_embeddings
    with torch.device("meta"):  # counts only; no memory, no init cost
        model = LlamaForCausalLM(config)
    n = tiny.num_parameters(model)
    assert lo <= n <= hi, (size, n)


def test_seed_determines_weights_and_leaves_global_rng(tok):
    state = torch.random.get_rng_state()
    a = tiny.build_model("1m", tok, seed=0)
    assert torch.equal(torch.random.get_rng_state(), state)
    b = tiny.build_model("1m", tok, seed=0)
    c = tiny.build_model("1m", tok, seed=1)
    wa, wb, wc = (m.model.layers[0].mlp.up_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb)
    assert not torch.equal(wa, wc)


def test_unknown_size_error(tok):
    with pytest.raises(ValueError, match="choose one of"):
        tiny.build_model("3m", tok)


def test_cli_writes_hf_directory(tmp_path, capsys):
    out = tmp_path / "cli"
    tiny.main(["--out", str(out), "--size", "1m", "--seed", "1"])
    assert "1.06M parameters" in capsys.readouterr().out
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in out.iterdir()
    }
    assert not (tmp_path / "cli.tmp").exists()
    # saving again replaces the directory atomically
    tiny.main(["--out", str(out), "--size", "1m", "--seed", "2"])
    assert not (tmp_path / "cli.old").exists() and (out / "model.safetensors").exists()

"""Tiny character-level Llama models for tests, CI and the CPU demo.

Nothing can be downloaded from a model hub on the development machines, and the suite runs offline
(``HF_HUB_OFFLINE=1``), so every test builds its policy here: a character-level tokenizer and a small
``LlamaForCausalLM`` with tied embeddings.
The saved directory is an ordinary Hugging Face model directory; the code path that loads it
(``AutoTokenizer`` / ``AutoModelForCausalLM.from_pretrained``) is the one used for real models.

Tokenizer: ids ``<pad>``=0, ``<bos>``=1, ``<eos>``=2, ``<unk>``=3, then ``"\\n"``=4 and printable ASCII
32..126 (ids 5..99); 100 ids in all. Every character is one token, any other character maps to ``<unk>``,
no special tokens are added on encode, and decoding concatenates tokens (a ``Fuse`` decoder), so
``decode(encode(s)) == s`` for any string of newlines and printable ASCII.

The model architecture is Llama, not Qwen2: with ``model_type: qwen2``, transformers 5.x ``AutoTokenizer``
silently swaps a char-level tokenizer for Qwen's (spaces and newlines lost). The saved ``tokenizer_config.json``
names ``PreTrainedTokenizerFast`` (an alias of ``TokenizersBackend`` in transformers 5.x, and the class
transformers 4.x, which vLLM pins, knows), so both reload the exact ``tokenizer.json``.

CLI::

    python -m inference.tiny --out runs/tiny-1m --size 1m [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from inference.names import TINY_SIZES

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")  # ids 0, 1, 2, 3
CHARS = ("\n",) + tuple(chr(c) for c in range(32, 127))  # ids 4 .. 99
VOCAB_SIZE = len(SPECIAL_TOKENS) + len(CHARS)  # 100
MAX_POSITIONS = 1024

SIZES = TINY_SIZES   # the shapes: inference/names.py (torch-free, for configs)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level fast tokenizer: one token per character, unknown characters -> ``<unk>`` (id 3)."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # "[\s\S]" rather than "." so that newlines are split off too.
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()  # concatenate; the default WordLevel decode joins tokens with spaces
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
        model_max_length=MAX_POSITIONS,
    )
    assert (fast.pad_token_id, fast.bos_token_id, fast.eos_token_id, fast.unk_token_id) == (0, 1, 2, 3)
    assert len(fast) == VOCAB_SIZE, len(fast)
    return fast


def model_config(size: str, tokenizer: PreTrainedTokenizerFast) -> LlamaConfig:
    if size not in SIZES:
        raise ValueError(f"unknown tiny model size {size!r}; choose one of {sorted(SIZES)}")
    return LlamaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        num_key_value_heads=SIZES[size]["num_attention_heads"],
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **SIZES[size],
    )


def build_model(size: str, tokenizer: PreTrainedTokenizerFast, *, seed: int = 0) -> LlamaForCausalLM:
    """A freshly initialised fp32 ``LlamaForCausalLM``; the same ``seed`` gives the same weights.

    The global torch RNG is left untouched (initialisation runs inside ``torch.random.fork_rng``).
    """
    config = model_config(size, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model


def num_parameters(model: torch.nn.Module) -> int:
    """Unique parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def save_pretrained_atomic(model, tokenizer, out_dir: str | os.PathLike, *, extra_files: dict | None = None) -> Path:
    """Save model + tokenizer to ``out_dir`` via ``out_dir.tmp`` and a rename (an existing ``out_dir`` is
    replaced). ``extra_files`` maps file names to JSON-serialisable objects written beside the model."""
    out = Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    _fix_tokenizer_config(tmp)
    for name, obj in (extra_files or {}).items():
        (tmp / name).write_text(json.dumps(obj, indent=2) + "\n")
    if out.exists():
        old = out.with_name(out.name + ".old")
        if old.exists():
            shutil.rmtree(old)
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old)
    else:
        os.replace(tmp, out)
    return out


def _fix_tokenizer_config(directory: Path) -> None:
    """Name ``PreTrainedTokenizerFast`` instead of transformers 5's ``TokenizersBackend``: both versions
    resolve it to the class that loads ``tokenizer.json`` as is (4.x does not know ``TokenizersBackend``)."""
    path = directory / "tokenizer_config.json"
    if not path.exists():
        return
    cfg = json.loads(path.read_text())
    if cfg.get("tokenizer_class") == "TokenizersBackend":
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
        path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def save_tiny(out_dir: str | os.PathLike, size: str, *, seed: int = 0) -> Path:
    """Build a fresh tiny model of ``size`` and save it (with its tokenizer) as a HF directory."""
    tokenizer = build_tokenizer()
    model = build_model(size, tokenizer, seed=seed)
    return save_pretrained_atomic(model, tokenizer, out_dir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output directory (replaced if it exists)")
    parser.add_argument("--size", required=True, choices=sorted(SIZES))
    parser.add_argument("--seed", type=int, default=0, help="initialisation seed")
    args = parser.parse_args(argv)
    tokenizer = build_tokenizer()
    model = build_model(args.size, tokenizer, seed=args.seed)
    out = save_pretrained_atomic(model, tokenizer, args.out)
    n = num_parameters(model)
    print(f"saved tiny-{args.size} ({n / 1e6:.2f}M parameters, vocab {len(tokenizer)}) to {out}")


if __name__ == "__main__":
    main()

"""The one rule for the token ids that end a response, used by every engine, the trainer, ``eval`` and the relay.

A response ends at any EOS id of the tokenizer or of the model's generation config (chat models often list
several), and at the end-of-turn tokens of the chat formats our templates write out when the vocabulary has them:
a base model (Qwen2.5-Math-7B's EOS is ``<|endoftext|>``) prompted in chat format ends its turn with
``<|im_end|>``, which must stop generation too, in training as in evaluation.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["END_OF_TURN", "eos_list", "stop_ids"]

END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<｜end▁of▁sentence｜>")


def eos_list(eos_token_id: int | Sequence[int] | None) -> list[int]:
    if eos_token_id is None:
        return []
    if isinstance(eos_token_id, int):
        return [eos_token_id]
    return [int(e) for e in eos_token_id]


def stop_ids(model, tokenizer) -> list[int]:
    """EOS ids of the tokenizer and the model's generation config, then the end-of-turn tokens the vocabulary
    has, each once, in that order (the first is the pad id of last resort)."""
    ids: list[int] = []
    gc = getattr(model, "generation_config", None)
    for src in (getattr(tokenizer, "eos_token_id", None), getattr(gc, "eos_token_id", None)):
        for e in eos_list(src):
            if e not in ids:
                ids.append(e)
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    ids += [int(vocab[t]) for t in END_OF_TURN if t in vocab and int(vocab[t]) not in ids]
    return ids

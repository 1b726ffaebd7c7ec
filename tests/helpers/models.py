"""A tiny randomly initialised Llama for the sampler's tests, and the overrides that keep trainer/configs/tiny.yaml on
the addition task the vLLM tests were written for."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

EOS = 2
PAD = 0
# tiny.yaml is the README's first run (countdown, the premise regime's dynamic sampling); the vLLM scenarios run it on
# 1-2 digit addition with the trainer's default sampling rounds, as they did before it changed
TINY_ADDITION = ("task=addition", "task_kwargs={min_digits: 1, max_digits: 2}", "max_sampling_rounds=3", "oversample=0")


def tiny_llama(seed: int = 0, vocab: int = 100) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention, as in Qwen2.5
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )
    return LlamaForCausalLM(cfg).eval()

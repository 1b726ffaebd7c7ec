"""Prompt templates: a question string in, the exact text the model is prompted with out.

| name | for | text |
|---|---|---|
| ``raw`` | tiny char-level task models | the question unchanged |
| ``qwen-math`` | Qwen2.5-Math (the paper's 7B runs) | its chat format, written out (no chat template needed) |
| ``qwen-boxed`` | chat models | question + boxed instruction, through the tokenizer's chat template when it has one |
| ``r1`` | DeepSeek-R1-Distill-Qwen | R1's user turn with the boxed instruction, ending in ``<think>\\n`` |
| ``lcb`` | LiveCodeBench | lcb_runner's system prompt + question via the chat template (see livecodebench.py) |

The rendered text is tokenized with ``tokenizer(text, add_special_tokens=False)`` (docs/architecture.md), so every
special token a model needs (``<|im_start|>``, ``<｜begin▁of▁sentence｜>``) is spelled out here.
"""

from __future__ import annotations

__all__ = ["BOXED_INSTRUCTION", "TEMPLATES", "render_prompt"]

BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def _raw(question: str, tokenizer=None) -> str:
    return question


def _qwen_math(question: str, tokenizer=None) -> str:
    # Qwen2.5-Math evaluation's "qwen25-math-cot" prompt: the instruction is the system turn.
    return (f"<|im_start|>system\n{BOXED_INSTRUCTION}<|im_end|>\n"
            f"<|im_start|>user\n{question}<|im_end|>\n"
            f"<|im_start|>assistant\n")


def _qwen_boxed(question: str, tokenizer=None) -> str:
    user = f"{question}\n{BOXED_INSTRUCTION}"
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                             add_generation_prompt=True)
    # no chat template (a base model, or no tokenizer at all): the plain text, as Qwen's "boxed" prompt
    return user + "\n"


def _r1(question: str, tokenizer=None) -> str:
    # DeepSeek-R1-Distill's chat template with add_generation_prompt, and the "<think>\n" its template forces
    return f"<｜begin▁of▁sentence｜><｜User｜>{question}\n{BOXED_INSTRUCTION}<｜Assistant｜><think>\n"


def _lcb(question: str, tokenizer=None) -> str:
    # LiveCodeBench's generic prompt (system turn + the question's user turn); it lives with the benchmark
    from eval.benchmarks.livecodebench import render_prompt as lcb_prompt
    return lcb_prompt(question, tokenizer)


TEMPLATES = {"raw": _raw, "qwen-math": _qwen_math, "qwen-boxed": _qwen_boxed, "r1": _r1, "lcb": _lcb}


def render_prompt(template: str, question: str, tokenizer=None) -> str:
    """Render ``question`` with the named template (see the module table)."""
    try:
        fn = TEMPLATES[template]
    except KeyError:
        raise ValueError(f"unknown prompt template {template!r}; choose one of {sorted(TEMPLATES)}") from None
    return fn(question, tokenizer)

"""Prompt templates: a question string in, the exact text the model is prompted with out.

| name | for | text |
|---|---|---|
| ``raw`` | tiny char-level task models | the question unchanged |
| ``qwen-math`` | Qwen2.5-Math (the paper's 7B runs) | its chat format, written out (no chat template needed) |
| ``qwen-boxed`` | chat models | question + boxed instruction, through the tokenizer's chat template when it has one |
| ``r1`` | DeepSeek-R1-Distill-Qwen | R1's user turn with the boxed instruction, ending in ``<think>\\n`` |
| ``lcb`` | LiveCodeBench | lcb_runner@28fef95's system prompt + question via the chat template (``lcb_prompt``) |

The rendered text is tokenized with ``tokenizer(text, add_special_tokens=False)`` (docs/architecture.md), so every
special token a model needs (``<|im_start|>``, ``<｜begin▁of▁sentence｜>``) is spelled out here.
"""

from __future__ import annotations

__all__ = ["BOXED_INSTRUCTION", "TEMPLATES", "MATH_TEMPLATES", "TASK_TEMPLATES", "render_prompt", "lcb_prompt",
           "lcb_question", "SYSTEM_PROMPT", "LCB_RUNNER_REVISION"]

BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."

# LiveCodeBench: lcb_runner's generic chat prompt, every string from one revision,
# LiveCodeBench/LiveCodeBench@28fef95ea8c9f7a547c8329f2cd3d32b92c1fa24:lcb_runner/prompts/code_generation.py
# (``PromptConstants``; the file last changed in 3a2406e, 2025-04-21; ``format_prompt_generation`` gives chat
# styles SYSTEM_MESSAGE_GENERIC as the system turn and ``get_generic_question_template_answer`` as the user turn).
# Since 264e841 (2024-12-26) SYSTEM_MESSAGE_GENERIC no longer ends in "You will NOT return anything except for the
# program." and FORMATTING_WITHOUT_STARTER_CODE goes on after "as follows."; the pair below is that revision's,
# and KlearReasoner's code rows open with the same system sentence (Kwai-Klear/KlearReasoner@3422f6d:README.md).
LCB_RUNNER_REVISION = "LiveCodeBench/LiveCodeBench@28fef95ea8c9f7a547c8329f2cd3d32b92c1fa24"
SYSTEM_PROMPT = ("You are an expert Python programmer. You will be given a question (problem specification) and will "
                 "generate a correct Python program that matches the specification and passes all tests.")
FORMAT_WITH_STARTER = ("You will use the following starter code to write the solution to the problem and enclose your "
                       "code within delimiters.")
FORMAT_WITHOUT_STARTER = ("Read the inputs from stdin solve the problem and write the answer to stdout (do not "
                          "directly test on the sample inputs). Enclose your code within delimiters as follows. "
                          "Ensure that when the python program runs, it reads the inputs, runs the algorithm and "
                          "writes output to STDOUT.")


def lcb_question(content: str, starter_code: str) -> str:
    """lcb_runner's ``get_generic_question_template_answer``: the user turn of the prompt."""
    prompt = f"### Question:\n{content}\n\n"
    if starter_code:
        prompt += f"### Format: {FORMAT_WITH_STARTER}\n```python\n{starter_code}\n```\n\n"
    else:
        prompt += f"### Format: {FORMAT_WITHOUT_STARTER}\n```python\n# YOUR CODE HERE\n```\n\n"
    prompt += "### Answer: (use the provided format with backticks)\n\n"
    return prompt


def lcb_prompt(question: str, tokenizer=None) -> str:
    """LiveCodeBench's prompt (the ``lcb`` template): system prompt + user turn, through the tokenizer's chat template when it has one."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"{SYSTEM_PROMPT}\n\n{question}"


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
    return lcb_prompt(question, tokenizer)


TEMPLATES = {"raw": _raw, "qwen-math": _qwen_math, "qwen-boxed": _qwen_boxed, "r1": _r1, "lcb": _lcb}

# which templates suit which training task (its reward; the trainer's preflight refuses the others): code gets
# LiveCodeBench's prompt, math a boxed-answer one, the embedded tasks (tiny char-level models without a chat template)
# their prompt as is. eval's default per benchmark is ``Benchmark.default_template``.
MATH_TEMPLATES = ("qwen-math", "qwen-boxed", "r1")
TASK_TEMPLATES = {"code": ("lcb",), "math": MATH_TEMPLATES, "addition": ("raw",), "countdown": ("raw",),
                  "minicode": ("raw",)}


def render_prompt(template: str, question: str, tokenizer=None) -> str:
    """Render ``question`` with the named template (see the module table)."""
    try:
        fn = TEMPLATES[template]
    except KeyError:
        raise ValueError(f"unknown prompt template {template!r}; choose one of {sorted(TEMPLATES)}") from None
    return fn(question, tokenizer)

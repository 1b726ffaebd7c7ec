"""Training prompts: load rows (local JSONL / JSON array, a hub dataset, or an embedded task) and hand out batches.

Rows are validated at load time: a malformed line or a row without the prompt or answer field fails with the
file and line named.

Code data (``task: code``) in the published verl/rllm layout (KlearReasoner-CodeSub-15K, DeepCoder): rows
``{"prompt": [{"role": "user", "content": ...}], "data_source": ..., "reward_model": {"ground_truth": <tests as a
JSON string>, "style": "rule"}, ...}``. ``code_tests(data_source, ground_truth)`` reads each source's test format
into the normalized fields ``scoring.rewards`` grades (``testtype``, ``tests``, ``fn_name``, ``test_match``,
``test_scripts``); ``code_question`` turns the statement into LiveCodeBench's user turn, so the ``lcb`` template
renders a training prompt exactly as ``eval`` renders a LiveCodeBench one. A format that cannot be graded here
fails with the file, line, field and the reason. The loader's position (epoch, offset) is part of the checkpoint, so a resumed run sees the
same prompts in the same order.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np

from contracts.jsonl import read_rows
from scoring.tasks import get_task
from scoring.templates import SYSTEM_PROMPT, lcb_question, render_prompt
from trainer.config import uses_traces


class DataError(ValueError):
    """A training data file that cannot be used; the message names the file, line and field."""


def _file_rows(path: str | Path) -> list[tuple[int, dict]]:
    """(number, row) of a training data file, JSON lines or a JSON array (``contracts.jsonl.read_rows``: the number is
    a row's line, or its position in the array; errors name the file and line), its errors as DataError."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"training data file '{path}' does not exist")
    try:
        return [(x.number, x.row) for x in read_rows(path)]
    except ValueError as exc:
        raise DataError(f"{exc}; a data file holds one JSON object per line, or one JSON array of objects") from None


def load_examples(cfg) -> list[dict]:
    """Rows with 'id', 'prompt', 'answer' (and the off-policy field when present), from cfg's source."""
    required = [cfg.prompt_key, cfg.answer_key]
    traces = uses_traces(cfg)
    if traces:
        required.append(cfg.off_policy_key)
    if not cfg.train_file:
        task = get_task(cfg.task)
        rows = task.make_examples(cfg.num_train_examples, seed=cfg.seed, **cfg.task_kwargs)
        source = f"task '{cfg.task}'"
        numbered = list(enumerate(rows, start=1))
    elif Path(cfg.train_file).exists():
        numbered = _file_rows(cfg.train_file)
        source = cfg.train_file
    else:
        numbered = list(enumerate(_load_hub(cfg.train_file, cfg.train_subset), start=1))
        source = f"hub dataset '{cfg.train_file}'"
    code = cfg.task == "code"
    examples, skipped = [], {}
    for lineno, row in numbered:
        values = {}
        for key in required:
            values[key] = get_field(row, key)
            if values[key] is None:
                raise DataError(f"{source}:{lineno}: row has no field '{key}' (fields: {sorted(row)}); "
                                f"set prompt_key/answer_key/off_policy_key to the right column")
        ex = dict(row)
        ex["prompt"] = _message_text(values[cfg.prompt_key])
        ex["answer"] = values[cfg.answer_key]
        if traces:
            ex[cfg.off_policy_key] = _message_text(values[cfg.off_policy_key])
        ex["id"] = str(row.get("id", lineno))
        if code:
            try:
                ex.update(code_fields(row, values[cfg.answer_key], answer_key=cfg.answer_key, statement=ex["prompt"]))
            except UnsupportedTests as exc:
                if not cfg.skip_unsupported_code_rows:
                    raise DataError(f"{source}:{lineno}: {exc}; set skip_unsupported_code_rows=true to leave such "
                                    f"rows out (they are counted)") from None
                skipped[exc.kind] = skipped.get(exc.kind, 0) + 1
                continue
            except ValueError as exc:
                raise DataError(f"{source}:{lineno}: {exc}") from None
        examples.append(ex)
    if skipped:
        print(f"{source}: left out {sum(skipped.values())} rows whose tests cannot be graded here "
              f"({', '.join(f'{k}: {v}' for k, v in sorted(skipped.items()))})", file=sys.stderr)
    if not examples:
        raise DataError(f"{source}: no training rows")
    if 0 < cfg.max_train_examples < len(examples):
        pick = np.random.default_rng([cfg.seed, 4608]).choice(len(examples), cfg.max_train_examples, replace=False)
        examples = [examples[i] for i in sorted(pick)]
    return examples


class Prompts(NamedTuple):
    ids: list[list[int]]     # the templated prompt ids of the trainable examples
    examples: list[dict]     # those examples
    dropped: dict            # prompts left out: prompt_too_long, luffy_trace_too_long


def tokenize_prompts(cfg, examples: list[dict], tokenizer) -> Prompts:
    """The templated prompt ids of the examples that can be trained: prompts longer than ``max_prompt_tokens`` are
    left out, and for LUFFY with ``luffy_long_traces=drop`` prompts whose off-policy trace (with EOS) exceeds
    ``max_response_tokens``, as LUFFY's own data is filtered to traces that fit (a trace cut at the budget would
    be trained as a response that never ends). Returns ids, the kept examples and the counts left out."""
    prompt_ids, kept = [], []
    counts = {"prompt_too_long": 0, "luffy_trace_too_long": 0}
    drop_traces = cfg.algorithm == "luffy" and cfg.luffy_long_traces == "drop"
    for ex in examples:
        ids = tokenizer(render_prompt(cfg.template, ex["prompt"], tokenizer), add_special_tokens=False)["input_ids"]
        if len(ids) > cfg.max_prompt_tokens:
            counts["prompt_too_long"] += 1
        elif drop_traces and len(off_policy_ids(tokenizer, ex, cfg.off_policy_key)) > cfg.max_response_tokens:
            counts["luffy_trace_too_long"] += 1
        else:
            prompt_ids.append(ids)
            kept.append(ex)
    assert kept, (f"no trainable prompt: {counts['prompt_too_long']} are longer than max_prompt_tokens="
                  f"{cfg.max_prompt_tokens}, {counts['luffy_trace_too_long']} have an off-policy trace longer than "
                  f"max_response_tokens={cfg.max_response_tokens} (luffy_long_traces=drop); raise the budgets")
    return Prompts(prompt_ids, kept, counts)


def off_policy_ids(tokenizer, example: dict, key: str) -> list[int]:
    """The token ids of an example's off-policy trace (LUFFY), EOS appended: the response the trace stands for."""
    return tokenizer(str(example[key]), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


# ------------------------------------------------------------------------------------------------ code data
class UnsupportedTests(ValueError):
    """A row whose tests are in a format the sandbox cannot run here (pytest files, tests in external files)."""

    def __init__(self, msg: str, kind: str):
        super().__init__(msg)
        self.kind = kind


# data_source -> how its ground truth reads (sources: rllm's ``rllm/rewards/code_reward.py`` as copied into
# KlearReasoner's ``verl/utils/reward_score/rllm_code_reward.py``, and KlearReasoner's ``code_r1_compute.py`` for its
# own ``coder1`` rows; a ``_longcot`` suffix selects the same reader, as KlearReasoner's dispatch does)
CODE_SOURCES = {
    "livecodebench": "list of {input, output, testtype: stdin|functional, metadata: {func_name}}: LiveCodeBench's format",
    "codeforces": "list of {input, output}: stdin",
    "primeintellect": "list of {input, output[, fn_name]}: stdin, or call-based with the arguments as a list (TACO's runner)",
    "taco": "{inputs: [...], outputs: [...][, fn_name]}: stdin, or call-based (gold may be wrapped in a list)",
    "apps": "as taco",
    "code_contests": "as taco",
    "leetcode": "{functional: <test code>}: appended to the solution, must exit 0",
    "coder1": "{inputs, outputs} stdin; {functional: <test code> | [test code, ...]}; ({pytest}, {inputs_file} unsupported)",
}
UNSUPPORTED_SOURCES = {
    "kodcode": "its tests are a pytest file, and pytest is not available inside the sandbox",
    "humanevalplus": "its tests are a check() program whose entry point the row does not name",
    "ifeval": "it is not a code task (instruction following)",
}

# the opening of LiveCodeBench's system prompt, which Code-R1/KlearReasoner rows repeat inside the user turn; the
# ``lcb`` template adds the system prompt itself, so it is taken off the statement
_LCB_PREAMBLE = SYSTEM_PROMPT   # statements that repeat LiveCodeBench's system prompt as their opening


def code_question(statement: str, starter_code: str = "") -> str:
    """LiveCodeBench's user turn (``scoring.templates.lcb_question``) for a training statement: the repeated
    system-prompt opening removed, a statement that already is such a turn kept."""
    text = statement.strip()
    if text.startswith("### Question:"):
        return statement
    if text.startswith(_LCB_PREAMBLE):
        text = text[len(_LCB_PREAMBLE):].lstrip()
    return lcb_question(text, starter_code)


def _as_text(x, field: str, join: str) -> str:
    if isinstance(x, str):
        return x
    if isinstance(x, list) and all(isinstance(v, str) for v in x):
        return join.join(x)
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return str(x)
    raise ValueError(f"{field} must be a string (or a list of lines), got {type(x).__name__}")


def _json_args(args, field: str) -> str:
    if not isinstance(args, list):
        raise ValueError(f"{field} of a call-based test must be the list of arguments, got {type(args).__name__}")
    return "\n".join(json.dumps(a) for a in args)


def _pairs(tests, field: str) -> list:
    if not isinstance(tests, list) or not tests:
        raise ValueError(f"{field} must be a non-empty list of {{input, output}} tests, got "
                         f"{type(tests).__name__ if not isinstance(tests, list) else 'an empty list'}")
    for i, t in enumerate(tests):
        if not isinstance(t, dict) or "input" not in t or "output" not in t:
            raise ValueError(f"{field}[{i}] must be an object with 'input' and 'output'")
    return tests


def _dict_of_lists(gt, field: str, *, join: str, stdin_join: str = "\n") -> dict:
    inputs, outputs = gt.get("inputs"), gt.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list) or not inputs:
        raise ValueError(f"{field} must hold non-empty lists 'inputs' and 'outputs'")
    if len(inputs) != len(outputs):
        raise ValueError(f"{field}: {len(inputs)} inputs but {len(outputs)} outputs")
    fn = gt.get("fn_name")
    if fn:
        return {"testtype": "functional", "fn_name": str(fn), "test_match": "taco",
                "tests": [{"input": _json_args(a, f"{field}.inputs[{i}]"), "output": json.dumps(o)}
                          for i, (a, o) in enumerate(zip(inputs, outputs))]}
    return {"testtype": "stdin", "tests": [{"input": _as_text(a, f"{field}.inputs[{i}]", stdin_join),
                                            "output": _as_text(o, f"{field}.outputs[{i}]", join)}
                                           for i, (a, o) in enumerate(zip(inputs, outputs))]}


def _scripts(value, field: str) -> list[str]:
    if isinstance(value, str) and value.strip():
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    raise ValueError(f"{field} must be test code (a string) or a non-empty list of test programs")


def code_tests(data_source: str, ground_truth, *, field: str = "reward_model.ground_truth") -> dict:
    """The normalized test fields (``scoring.rewards``) of one row from its ``data_source`` and ground truth (the
    published JSON string, or already parsed). ValueError naming ``field`` for a malformed one;
    ``UnsupportedTests`` for a format the sandbox cannot run here."""
    src = str(data_source)
    base = src[:-len("_longcot")] if src.endswith("_longcot") else src
    if base in UNSUPPORTED_SOURCES:
        raise UnsupportedTests(f"data_source '{src}' cannot be graded here: {UNSUPPORTED_SOURCES[base]}", base)
    if base not in CODE_SOURCES:
        raise ValueError(f"data_source '{src}' has no known test format (known: "
                         f"{', '.join(sorted(CODE_SOURCES))}, each optionally with _longcot)")
    gt = ground_truth
    if isinstance(gt, str):
        try:
            gt = json.loads(gt)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{field} is not valid JSON ({exc.msg} at char {exc.pos})") from None
    if base == "livecodebench":
        tests = _pairs(gt, field)
        kinds = {t.get("testtype", "stdin") for t in tests}
        if len(kinds) != 1 or not kinds <= {"stdin", "functional"}:
            raise ValueError(f"{field}: every test's testtype must be stdin or functional, and all the same; got "
                             f"{sorted(map(str, kinds))}")
        out = {"testtype": kinds.pop(), "test_match": "lcb",
               "tests": [{"input": _as_text(t["input"], f"{field}[{i}].input", "\n"),
                          "output": _as_text(t["output"], f"{field}[{i}].output", "\n")} for i, t in enumerate(tests)]}
        if out["testtype"] == "functional":
            meta = tests[0].get("metadata") or {}
            if isinstance(meta, str):
                try:
                    meta = json.loads(meta)
                except json.JSONDecodeError:
                    meta = {}
            if not isinstance(meta, dict) or not meta.get("func_name"):
                raise ValueError(f"{field}[0].metadata.func_name is missing: a functional LiveCodeBench test needs "
                                 f"the function name")
            out["fn_name"] = str(meta["func_name"])
        return out
    if base == "codeforces":
        tests = _pairs(gt, field)
        return {"testtype": "stdin", "tests": [{"input": _as_text(t["input"], f"{field}[{i}].input", "\n"),
                                                "output": _as_text(t["output"], f"{field}[{i}].output", "\n")}
                                               for i, t in enumerate(tests)]}
    if base == "primeintellect":
        tests = _pairs(gt, field)
        fn = tests[0].get("fn_name")
        if fn:
            return {"testtype": "functional", "fn_name": str(fn), "test_match": "taco",
                    "tests": [{"input": _json_args(t["input"], f"{field}[{i}].input"), "output": json.dumps(t["output"])}
                              for i, t in enumerate(tests)]}
        return {"testtype": "stdin", "tests": [{"input": _as_text(t["input"], f"{field}[{i}].input", "\n"),
                                                "output": _as_text(t["output"], f"{field}[{i}].output", "\n")}
                                               for i, t in enumerate(tests)]}
    if not isinstance(gt, dict):
        raise ValueError(f"{field} of a '{src}' row must be a JSON object, got {type(gt).__name__}")
    if base in ("taco", "apps", "code_contests"):
        return _dict_of_lists(gt, field, join="\n")
    if base == "leetcode":
        if "functional" not in gt:
            raise ValueError(f"{field} of a leetcode row must hold 'functional' (the test code)")
        return {"testtype": "assert", "test_scripts": _scripts(gt["functional"], f"{field}.functional")}
    # coder1 (KlearReasoner's own rows, after Code-R1)
    if "functional" in gt:
        return {"testtype": "assert", "test_scripts": _scripts(gt["functional"], f"{field}.functional")}
    if "pytest" in gt:
        raise UnsupportedTests(f"{field}.pytest: pytest tests cannot be graded here (pytest is not available "
                               f"inside the sandbox)", "pytest")
    if "inputs_file" in gt or "outputs_file" in gt:
        raise UnsupportedTests(f"{field}.inputs_file: tests stored in external files cannot be graded (the files "
                               f"are not part of the row)", "inputs_file")
    if "inputs" in gt:
        # Code-R1 joins a list-valued test with ", " (code_r1_compute.sample_test_cases)
        out = _dict_of_lists(gt, field, join=", ", stdin_join=", ")
        out["test_match"] = "lcb"
        return out
    raise ValueError(f"{field} of a '{src}' row has none of inputs/outputs, functional, pytest (keys: "
                     f"{sorted(gt)})")


def code_fields(row: dict, answer, *, answer_key: str, statement: str) -> dict:
    """What ``load_examples`` adds to a code row: the normalized tests, the LiveCodeBench user turn as ``prompt``
    (statement plus the row's starter code, when it has one) and ``data_source``."""
    if "data_source" in row:
        out = code_tests(row["data_source"], answer, field=answer_key)
    elif isinstance(answer, list) and "reward_model" not in row:   # our own rows: tests, testtype, fn_name fields
        tests = answer
        kind = row.get("testtype", "stdin")
        if kind not in ("stdin", "functional"):
            raise ValueError(f"field 'testtype' must be stdin or functional, got {kind!r}")
        out = {"testtype": kind, "tests": _pairs(tests, answer_key)}
        if kind == "functional":
            if not row.get("fn_name"):
                raise ValueError("a functional row needs the field 'fn_name'")
            out["fn_name"] = str(row["fn_name"])
    else:
        raise ValueError("row has no field 'data_source' (which selects how reward_model.ground_truth reads)")
    if "ability" in row and row["ability"] != "code":
        raise ValueError(f"field 'ability' is {row['ability']!r}: not a code row (task: code)")
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
    starter = row.get("starter_code") or extra.get("starter_code") or ""
    out["prompt"] = code_question(statement, str(starter))
    return out


def get_field(row: dict, key: str):
    """``row[key]``, where a dotted key reaches into nested mappings (reward_model.ground_truth)."""
    if key in row:
        return row[key]
    value = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _message_text(value) -> str:
    # verl-style rows hold chat messages; take the last turn's content.
    if isinstance(value, list) and value and isinstance(value[-1], dict) and "content" in value[-1]:
        return str(value[-1]["content"])
    return str(value)


def _load_hub(name: str, subset: str = "") -> list[dict]:
    try:
        import datasets
    except ImportError:
        raise DataError(f"train_file '{name}' is not a local file; to read it from the hub install `datasets`, "
                        f"or download it and point train_file at the local copy") from None
    try:
        return list(datasets.load_dataset(name, subset or None, split="train"))
    except Exception as exc:  # offline, unknown id, ...
        raise DataError(f"could not load hub dataset '{name}' ({exc}); point train_file at a local file") from None


class PromptLoader:
    """Shuffled epochs over example indices; the state is (epoch, offset) and fully determines the order."""

    def __init__(self, n: int, *, seed: int):
        self.n, self.seed = n, seed
        self.epoch, self.offset = 0, 0
        self._perm = self._permutation(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.n)

    def next(self, count: int) -> list[int]:
        out = []
        while len(out) < count:
            if self.offset == self.n:
                self.epoch, self.offset = self.epoch + 1, 0
                self._perm = self._permutation(self.epoch)
            take = min(count - len(out), self.n - self.offset)
            out.extend(int(i) for i in self._perm[self.offset:self.offset + take])
            self.offset += take
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset, "n": self.n, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state["n"] != self.n:
            raise DataError(f"the checkpoint was written with {state['n']} training rows but the data now has "
                            f"{self.n}; resume with the same data or start a new run")
        self.epoch, self.offset = state["epoch"], state["offset"]
        self._perm = self._permutation(self.epoch)

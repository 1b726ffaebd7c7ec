"""The benchmark interface: every benchmark module builds one ``Benchmark`` and the registry lists them.

A benchmark knows how to load its problems (from a path, or its default location), how to render a problem
into the question text a template wraps, and how to grade one response. Generation defaults: n = 32 is the paper's
(avg@32, §5.1); the paper states no sampling settings, so temperature 0.6 / top-p 0.95 are DeepSeek-R1's and the
Qwen3 cards' (eval/configs/<profile>.yaml cites each backbone's; docs/evaluation.md). The version string changes
whenever loading or grading changes, and is written next to every score, with the data source (``describe``) and a
fingerprint of the problems.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

# Verdicts that are not a grade (scoring.verdict): counted and shown, never scored (excluded from every average),
# a run that has any exits non-zero unless asked otherwise, and a resumed run grades those samples again.
from scoring.verdict import GRADER_ERROR, UNGRADED_VERDICTS, Verdict

# the folder benchmark files are read from when set (math/<name>.jsonl, code/livecodebench/..., docs/data.md): one
# variable for every benchmark, the trainer's validation and the dry run's download plan
DATA_ENV = "THINKING_SEEDS_DATA"


@dataclass(frozen=True)
class Problem:
    id: str                 # stable id within the benchmark (used for resume and paired comparisons)
    question: str           # text before templating
    gold: Any               # benchmark-specific gold: a str for math, a test spec for code
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Benchmark:
    name: str
    version: str
    kind: str                                   # "math" | "code" | "task"
    load: Callable[..., list[Problem]]          # load(path: str | None = None, **filters) -> list[Problem]
    grade: Callable[[str, Problem], Verdict]    # grade(response, problem) -> Verdict
    default_template: str = "qwen-math"
    generation: dict = field(default_factory=lambda: {"n": 32, "temperature": 0.6, "top_p": 0.95, "max_tokens": 4096})
    description: str = ""
    # describe(problems, path, **filters) -> dict: where the problems came from (file, release, version...), written
    # into every result's settings; None: eval.run records the path it was given and a fingerprint of the problems
    describe: Callable[..., dict] | None = None
    # keyword filters load() accepts beyond the path (livecodebench: release, start_date, end_date)
    filters: tuple[str, ...] = ()

"""LiveCodeBench code generation (``livecodebench/code_generation_lite``), graded in the sandbox like lcb_runner.

**Data.** The Hugging Face dataset's JSONL files, one problem per line with ``question_title``,
``question_content``, ``platform`` (leetcode|atcoder|codeforces), ``question_id``, ``contest_id``,
``contest_date`` (ISO), ``starter_code``, ``difficulty``, ``public_test_cases`` (a JSON string of
``[{"input", "output", "testtype": "stdin"|"functional"}]``), ``private_test_cases`` (the same JSON string, or
``base64(zlib(pickle(json_string)))``) and ``metadata`` (a JSON string; ``func_name`` for functional problems).
Nothing is downloaded: pass a path, or set ``THINKING_SEEDS_DATA`` to a folder with ``code/livecodebench/``
holding the dataset's files (``test.jsonl`` ... ``test6.jsonl``, as in the dataset repository).

**Private tests are decoded without running pickle code**: the payload must be a pickled ``str``; an Unpickler
whose ``find_class`` always raises refuses anything that names a callable (``__reduce__`` payloads such as
``os.system``), then ``json.loads``. Loading validates every problem's tests before any generation starts; the
decoded private tests are not kept in memory (they are decoded again when a problem is graded, cached for the
two most recent problems).

**Releases** (lcb_runner ``--release_version``; the dataset card gives the windows by month):

| tag | files | problems | contest dates (inclusive) |
|---|---|---|---|
| release_v1 | test.jsonl | 400 | 2023-05-01 .. 2024-03-31 |
| release_v2 | + test2.jsonl | 511 | 2023-05-01 .. 2024-05-31 |
| release_v3 | + test3.jsonl | 612 | 2023-05-01 .. 2024-07-31 |
| release_v4 | + test4.jsonl | 713 | 2023-05-01 .. 2024-09-30 |
| release_v5 | + test5.jsonl | 880 | 2023-05-01 .. 2025-01-31 |
| release_v6 | + test6.jsonl | 1055 | 2023-05-01 .. 2025-05-01 |

``vN`` is the problems added in release N (``testN.jsonl``), ``vA_vB`` releases A..B, ``release_vN`` all up to N.
**A tag is one problem set whatever the source form**: the tag's files *and* its contest-date window. Given a
folder, the tag's files are read and the window applied to them; given one file (``test6.jsonl`` itself, or a
file holding several releases), the window is applied to it. So ``v6`` is the same problems from the folder as
from its ``test6.jsonl`` alone, or from one file holding all six (tests/scoring/test_lcb_v6.py); a row of the tag's files
dated outside the window is left out in both forms and counted (``selection_summary`` names the count,
``describe`` records it). One file holding several releases can give more than the folder for a tag that ends
before v6 only if some file holds rows dated in an earlier release's window, which the dataset card rules out.
Pass ``release=None`` (``--lcb-release all``) for every file given, whole.

**v6** (the default; the paper's "LiveCodeBench-v6") is contest dates 2025-02-01 .. 2025-05-01, **both ends
inclusive**, compared on the contest's calendar date. The paper states no window (§5.1 cites Jain et al. 2025);
the published v6 numbers it is compared with do: its code setting trains Qwen3-4B-Thinking-2507 on
KlearReasoner-CodeSub-15k, and KlearReasoner reports "v6 (2025/02/01-2025/05/01)"
(Kwai-Klear/KlearReasoner@3422f6d:README.md, the figure caption) while Qwen's cards report "LiveCodeBench v6
(25.02-25.05)" (the Qwen3-2507 model cards' tables, Qwen3-4B-Thinking-2507's among them): one window.
Run through lcb_runner as ``--start_date 2025-02-01 --end_date 2025-05-01``, its filter is ``start <=
contest_date <= end`` on datetimes (LiveCodeBench/LiveCodeBench@28fef95:lcb_runner/benchmarks/code_generation.py,
``load_code_generation_dataset``), which includes 2025-05-01 at midnight: the end is inclusive as written. The
dataset card's "Apr 2025" would end on 2025-04-30; release_v6's files hold no contest dated 2025-05-01 (the card:
up to Apr 2025), so both ends select the same problems from them, the 175 of ``test6.jsonl``. That count, and
that ``test6.jsonl`` holds no row before 2025-02-01, are the dataset card's; the dataset is not stored here to
check. The other tags' windows are the card's months, first to last day.

``start_date``/``end_date`` (``YYYY-MM-DD``, inclusive, on the contest's calendar date, like lcb_runner's
``--start_date``/``--end_date`` for the dataset's midnight timestamps) narrow either form.
``selection_summary(problems)`` is the line to print next to a score: what was selected and how many problems.

**Prompt** (lcb_runner's generic chat prompt, pinned to one revision: ``scoring.templates``): system
``SYSTEM_PROMPT``; user = ``### Question:`` + the
statement, then either the starter code and "use the following starter code" or "read the inputs from stdin"
with a ```` ```python ```` placeholder, then ``### Answer: (use the provided format with backticks)``.
``Problem.question`` is that user turn (``scoring.templates.lcb_question``); ``render_prompt("lcb", question,
tokenizer)`` (``scoring.templates``) adds the system turn through the tokenizer's chat template.

**Grading**: the program lcb_runner would extract (``scoring.code.extract_code_lcb``: the last fenced block,
whole response searched) runs under lcb_runner's harness in the sandbox (``scoring.code.grade_code``, one process
for all tests, lcb's stdin mock and shared ``Solution()``) on the public then the private tests, 6 s per test
(address space capped at 4 GiB; both ``scoring.limits.CODE_LIMITS``), stopping at the first failure.
docs/graders.md: agreement with lcb_runner and every known difference.

**Recorded**: ``python -m eval.run --lcb-release TAG --lcb-start-date D --lcb-end-date D`` select; ``describe``
is what each result line's settings keep of the data: the files with their sha256, the release, its definition
(files, window with its inclusive ends and where it comes from), the rows left out as outside the window, and
``selection_summary``.
"""

from __future__ import annotations

import base64
import binascii
import functools
import io
import json
import os
import pickle
import zlib
from datetime import date, datetime
from pathlib import Path

from scoring.benchmarks.base import DATA_ENV, Benchmark, Problem, Verdict
from contracts.jsonl import iter_jsonl
from scoring.code import LCB_IMPORT_PRELUDE, extract_code_lcb, grade_code
from scoring.limits import CODE_LIMITS
from scoring.templates import lcb_question

__all__ = ["BENCHMARK", "VERSION", "RELEASES", "WINDOW_SOURCE", "WINDOW_ENDS", "CODE_GENERATION", "load",
           "decode_private_tests", "tests_of", "selection_summary", "definition", "describe", "grade"]

VERSION = "livecodebench-3"   # 2: lcb_runner's extraction and harness; 3: one v6 definition, lcb_runner@28fef95's prompt
HUB_DATASET = "livecodebench/code_generation_lite"   # where the files come from (not pinned: files select a release)
# the paper: avg@32; Qwen3-4B-Thinking-2507 trained with 16k-token responses; Qwen3's sampling advice 0.6 / 0.95
CODE_GENERATION = {"n": 32, "temperature": 0.6, "top_p": 0.95, "max_tokens": 16384}

_FILES = ["test.jsonl", "test2.jsonl", "test3.jsonl", "test4.jsonl", "test5.jsonl", "test6.jsonl"]
# the last contest date of each release, inclusive: the last day of the dataset card's last month for v1..v5;
# v6 ends at KlearReasoner's 2025/05/01 (the module docstring); every release starts at 2023-05-01
_RELEASE_END = [date(2024, 3, 31), date(2024, 5, 31), date(2024, 7, 31), date(2024, 9, 30), date(2025, 1, 31),
                date(2025, 5, 1)]
_FIRST = date(2023, 5, 1)
WINDOW_SOURCE = ("v6 2025-02-01..2025-05-01: Kwai-Klear/KlearReasoner@3422f6d:README.md 'v6 (2025/02/01-2025/05/01)' "
                 "= Qwen3-2507 cards 'LiveCodeBench v6 (25.02-25.05)'; other ends: the dataset card's months")
WINDOW_ENDS = "both inclusive, on the contest's calendar date"


def _window(first: int, last: int) -> tuple[date, date]:
    start = _FIRST if first == 1 else _next_day(_RELEASE_END[first - 2])
    return start, _RELEASE_END[last - 1]


def _next_day(d: date) -> date:
    return date.fromordinal(d.toordinal() + 1)


def _release_table() -> dict[str, tuple[list[str], date, date]]:
    table = {}
    for n in range(1, 7):
        table[f"release_v{n}"] = (_FILES[:n], *_window(1, n))
        table[f"v{n}"] = (_FILES[n - 1:n], *_window(n, n))
        for m in range(n + 1, 7):
            table[f"v{n}_v{m}"] = (_FILES[n - 1:m], *_window(n, m))
    table["release_latest"] = table["release_v6"]
    return table


RELEASES = _release_table()   # tag -> (files, first contest date, last contest date), both dates inclusive


def definition(release: str | None) -> dict:
    """What a tag selects, as the result files record it: its files and its contest-date window with the ends'
    inclusiveness and where the window comes from (``release=None``: every file given, no window)."""
    if release is None:
        return {"release": "all", "files": "every file given", "window": None}
    files, first, last = RELEASES[release]
    return {"release": release, "files": list(files), "window": {"from": first.isoformat(), "to": last.isoformat(),
                                                                "ends": WINDOW_ENDS, "source": WINDOW_SOURCE}}


# --------------------------------------------------------------------------------------------- decoding

class _StrOnlyUnpickler(pickle.Unpickler):
    """Unpickles plain data only: any reference to a class or callable (how pickle runs code) is refused."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: the private tests must be a pickled str")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("refusing a persistent id in the private tests")


def decode_private_tests(raw: str) -> list[dict]:
    """``private_test_cases`` -> list of test dicts. Accepts the JSON string itself or
    ``base64(zlib(pickle(json_string)))``; never executes pickle code (ValueError instead)."""
    raw = raw.strip()
    if raw.startswith("["):
        tests = json.loads(raw)
    else:
        try:
            blob = zlib.decompress(base64.b64decode(raw.encode("ascii"), validate=True))
        except (binascii.Error, zlib.error, UnicodeEncodeError, ValueError) as e:
            raise ValueError(f"private_test_cases is neither JSON nor base64(zlib(pickle)): {e}") from None
        try:
            payload = _StrOnlyUnpickler(io.BytesIO(blob)).load()
        except pickle.UnpicklingError as e:
            raise ValueError(f"private_test_cases: unsafe or malformed pickle refused ({e})") from None
        except Exception as e:   # truncated or corrupt pickles raise many types
            raise ValueError(f"private_test_cases: malformed pickle ({type(e).__name__}: {e})") from None
        if not isinstance(payload, str):
            raise ValueError(f"private_test_cases: the pickle holds a {type(payload).__name__}, expected str")
        tests = json.loads(payload)
    _check_tests(tests, "private_test_cases")
    return tests


def _check_tests(tests, what: str) -> None:
    if not isinstance(tests, list):
        raise ValueError(f"{what}: expected a list of tests, got {type(tests).__name__}")
    for i, t in enumerate(tests):
        if not isinstance(t, dict) or not isinstance(t.get("input"), str) or not isinstance(t.get("output"), str):
            raise ValueError(f"{what}[{i}]: a test needs string fields 'input' and 'output'")
        if t.get("testtype") not in ("stdin", "functional"):
            raise ValueError(f"{what}[{i}]: testtype must be 'stdin' or 'functional', got {t.get('testtype')!r}")


@functools.lru_cache(maxsize=2)
def _decoded(raw: str) -> tuple[dict, ...]:
    return tuple(decode_private_tests(raw))


def tests_of(problem: Problem) -> list[dict]:
    """Public then private tests of a problem (the order lcb_runner grades them in)."""
    gold = problem.gold
    return list(gold["public"]) + list(_decoded(gold["private"]))


# --------------------------------------------------------------------------------------------- loading

def _default_path() -> Path:
    root = os.environ.get(DATA_ENV)
    if not root:
        raise FileNotFoundError(f"livecodebench: no problems path given and {DATA_ENV} is not set. LiveCodeBench is "
                                f"not stored with this project (release_v6 is about 4.5 GB) and never downloaded: "
                                f"{layout_hint()}")
    path = Path(root) / "code" / "livecodebench"
    if not path.is_dir():
        raise FileNotFoundError(f"livecodebench: {DATA_ENV}={root} but {path} does not exist: {layout_hint()}")
    return path


def layout_hint() -> str:
    """Where LiveCodeBench's files come from and where they go, as the sentence a missing folder ends with."""
    return (f"download the files of the hub dataset {HUB_DATASET} into ${DATA_ENV}/code/livecodebench/ (test.jsonl "
            f"... test6.jsonl as the dataset repository names them; release_v6 needs all six, the default v6 only "
            f"test6.jsonl: `hf download {HUB_DATASET} test6.jsonl --repo-type dataset --local-dir "
            f"${DATA_ENV}/code/livecodebench`; {DATA_ENV} names the data folder, the one holding math/ and code/), "
            f"or pass that folder or one file with --problems (docs/data.md)")


_FIELDS = ("question_title", "question_content", "platform", "question_id", "contest_id", "contest_date",
           "starter_code", "difficulty", "public_test_cases", "private_test_cases", "metadata")


def _parse_date(s: str, what: str) -> date:
    try:
        return date.fromisoformat(s)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be YYYY-MM-DD, got {s!r}") from None


def _problem(row: dict, where: str, source: str) -> Problem:
    missing = [k for k in _FIELDS if k not in row]
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing} (is this a code_generation_lite file?)")
    try:
        when = datetime.fromisoformat(row["contest_date"])
        public = json.loads(row["public_test_cases"])
        _check_tests(public, "public_test_cases")
        private_raw = row["private_test_cases"]
        if not isinstance(private_raw, str):
            raise ValueError("private_test_cases must be a string")
        private_n = len(decode_private_tests(private_raw))   # validate now, before any generation
        metadata = json.loads(row["metadata"]) if row["metadata"] else {}
    except (ValueError, TypeError) as e:
        raise ValueError(f"{where} ({row.get('question_id')}): {e}") from None
    # lcb_runner decides call-based vs stdin by metadata.func_name alone
    kind = "functional" if metadata.get("func_name") else "stdin"
    if kind == "stdin" and any(t["testtype"] == "functional" for t in public):
        raise ValueError(f"{where} ({row['question_id']}): functional tests but no metadata.func_name")
    return Problem(
        id=str(row["question_id"]),
        question=lcb_question(row["question_content"], row["starter_code"]),
        gold={"kind": kind, "fn_name": metadata.get("func_name"), "public": public, "private": private_raw},
        meta={"title": row["question_title"], "platform": row["platform"], "contest_id": row["contest_id"],
              "contest_date": when.isoformat(), "difficulty": row["difficulty"], "starter_code": row["starter_code"],
              "n_tests": len(public) + private_n, "source": source})


def load(path: str | os.PathLike | None = None, *, release: str | None = "v6", start_date: str | None = None,
         end_date: str | None = None) -> list[Problem]:
    """LiveCodeBench problems (see the module docstring for releases, windows and where the data comes from).

    ``path``: a folder holding the dataset's ``test*.jsonl`` or one JSONL file; default
    ``$THINKING_SEEDS_DATA/code/livecodebench``. A malformed line fails naming the file and line.
    """
    if release is not None and release not in RELEASES:
        raise ValueError(f"unknown LiveCodeBench release {release!r}; choose from {sorted(RELEASES)} or None")
    path = Path(path) if path is not None else _default_path()
    lo = _parse_date(start_date, "start_date") if start_date else None
    hi = _parse_date(end_date, "end_date") if end_date else None
    if path.is_dir():
        names = RELEASES[release or "release_latest"][0]
        missing = [n for n in names if not (path / n).is_file()]
        if missing:
            raise FileNotFoundError(f"{path}: release {release or 'release_latest'} needs {names}; missing {missing}")
        files = [path / n for n in names]
    elif path.is_file():
        files = [path]
    else:
        raise FileNotFoundError(f"LiveCodeBench problems path {path} does not exist")
    # one definition in both forms: the tag's window applies to the folder's files as to a single file
    window = RELEASES[release][1:] if release is not None else None
    problems, seen, outside = [], set(), {}
    for file in files:
        for lineno, row in iter_jsonl(file):   # streamed: the dataset's files are hundreds of MB
            where = f"{file}:{lineno}"
            try:
                day = datetime.fromisoformat(row["contest_date"]).date()
            except (KeyError, TypeError, ValueError):
                raise ValueError(f"{where}: missing or malformed contest_date {row.get('contest_date')!r}") from None
            if window is not None and not window[0] <= day <= window[1]:
                outside[file.name] = outside.get(file.name, 0) + 1
                continue
            if (lo is not None and day < lo) or (hi is not None and day > hi):
                continue
            p = _problem(row, where, file.name)
            if p.id in seen:
                raise ValueError(f"{where}: duplicate question_id {p.id!r}")
            seen.add(p.id)
            problems.append(p)
    label = release if release is not None else "all"
    for p in problems:
        p.meta["selection"] = _label(label, start_date, end_date)
        p.meta["outside_window"] = outside   # one dict for the selection: what describe and the summary report
    return problems


def _label(release: str, start: str | None, end: str | None) -> str:
    s = f"release={release}"
    if start or end:
        s += f" dates={start or ''}..{end or ''}"
    return s


def selection_summary(problems: list[Problem]) -> str:
    """``livecodebench release=v6: 175 problems (2025-02-01..2025-04-30)``: what to print beside a score (the
    first and last contest dates of the problems), with the rows of the tag's files dated outside its window."""
    if not problems:
        return "livecodebench: 0 problems"
    days = sorted(p.meta["contest_date"][:10] for p in problems)
    line = f"livecodebench {problems[0].meta.get('selection', '')}: {len(problems)} problems ({days[0]}..{days[-1]})"
    outside = problems[0].meta.get("outside_window") or {}
    if outside:
        rows = sum(outside.values())
        line += (f"; {rows} row{'s' * (rows != 1)} of {', '.join(sorted(outside))} dated outside the release's "
                 f"window left out")
    return line


# --------------------------------------------------------------------------------------------- prompt, grade

def grade(response: str, problem: Problem, *, timeout_s: float = CODE_LIMITS.test_s,
          memory_mb: int = CODE_LIMITS.memory_mb) -> Verdict:
    """The program lcb_runner would take from the response (``extract_code_lcb``: the last fenced block, the whole
    response searched) on the public then private tests, run under lcb_runner's harness in the sandbox
    (``scoring.code.grade_code``; the first failure stops)."""
    gold = problem.gold
    return grade_code(extract_code_lcb(response), tests_of(problem), kind=gold["kind"], fn_name=gold["fn_name"],
                      timeout_s=timeout_s, memory_mb=memory_mb, prelude=LCB_IMPORT_PRELUDE, harness="lcb")


def describe(problems: list[Problem], path: str | os.PathLike | None = None, *, release: str | None = "v6",
             start_date: str | None = None, end_date: str | None = None) -> dict:
    """The data source of a selection, for the result files: the folder or file read, the files the problems came
    from with their sizes and sha256, the release tag and its ``definition`` (files, window, inclusive ends, source),
    the rows of the tag's files left out as dated outside the window (per file), and ``selection_summary``."""
    import hashlib
    base = Path(path) if path is not None else _default_path()
    folder = base if base.is_dir() else base.parent
    files = {}
    for name in sorted({p.meta["source"] for p in problems}):
        f = folder / name
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
        files[name] = {"bytes": f.stat().st_size, "sha256": h.hexdigest()}
    return {"dataset": "livecodebench/code_generation_lite", "path": str(base.resolve()), "files": files,
            "release": release if release is not None else "all", "definition": definition(release),
            "outside_window": dict(problems[0].meta.get("outside_window") or {}) if problems else {},
            "start_date": start_date, "end_date": end_date, "selection": selection_summary(problems)}


BENCHMARK = Benchmark(
    name="livecodebench", version=VERSION, kind="code", load=load, grade=grade, default_template="lcb",
    generation=dict(CODE_GENERATION), describe=describe, filters=("release", "start_date", "end_date"),
    description="LiveCodeBench code generation (code_generation_lite), default release v6 (contest dates "
                "2025-02-01..2025-05-01 inclusive: 175 problems), public + private tests in the sandbox")

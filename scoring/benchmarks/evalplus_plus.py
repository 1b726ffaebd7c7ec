"""HumanEval+ and MBPP+ (EvalPlus's data files), graded in the sandbox with EvalPlus's own loading and checking.

**HumanEval+ / MBPP+** (``HUMANEVAL_PLUS``, ``MBPP_PLUS``) go through the ``evalplus`` package (the
``[evalplus]`` extra; docs/graders.md lists every difference with EvalPlus):

- data: EvalPlus's own loader (``get_human_eval_plus`` / ``get_mbpp_plus``, so MBPP+'s per-task input
  deserialisation is EvalPlus's), given a local ``HumanEvalPlus.jsonl[.gz]`` / ``MbppPlus.jsonl[.gz]`` as its
  override path (offline), or EvalPlus's default release (v0.1.10 / v0.2.0; EvalPlus downloads it, online);
  lines are checked first so an error names FILE:LINE; duplicate task ids are refused.
- expected outputs: like EvalPlus's ``get_groundtruth`` (``prompt + canonical_solution``, a deepcopy of every
  input, timed; MBPP+'s output-not-None tasks), run in the sandbox once per problem. A canonical solution that
  raises makes the problem ungradable (``GroundTruthError``; EvalPlus itself would stop the whole run).
- the candidate: in the sandbox, under EvalPlus's own ``reliability_guard``, ``swallow_io`` and ``time_limit``
  (from the installed ``evalplus/eval/utils.py``) with EvalPlus's per-input limits ``max(1 s, 4 x the canonical
  time)``, base inputs then plus inputs, stopping at the first exception (its ``fast_check``).
- the check: EvalPlus's ``untrusted_check`` itself, replaying the outputs the candidate returned in the sandbox
  (its special oracles, type check before the tolerance, ``np.allclose``), in a small worker process. The
  candidate's code never runs outside the sandbox and never sees the expected outputs.

The HumanEval+ program is HumanEval's (``scoring.benchmarks.humaneval.extract_completion``); MBPP+'s is the sanitised
code block. Limits: ``scoring.limits.CODE_LIMITS`` (``evalplus_task_s``, ``evalplus_ground_truth_s``,
``evalplus_memory_mb``).

**Data location**: an explicit path (``--problems FILE``), else ``$THINKING_SEEDS_DATA/code/humaneval_plus/
HumanEvalPlus.jsonl[.gz]`` / ``code/mbpp_plus/MbppPlus.jsonl[.gz]``, else EvalPlus's own default release.
"""

from __future__ import annotations

import atexit
import json
import multiprocessing
import os
import threading
from pathlib import Path

from contracts.jsonl import read_rows
from scoring.benchmarks.base import DATA_ENV, Benchmark, Problem, Verdict
from scoring.benchmarks.humaneval import CODE_GENERATION, extract_completion, sanitize
from scoring.code import extract_code, program_packages, short_repr, verdict_of_status
from scoring.limits import CODE_LIMITS
from scoring.pool import WorkerPool, apply
from scoring.sandbox import DEFAULT_MAX_OUTPUT, Opaque, decode_tagged, encode_tagged, run_harness

__all__ = ["HUMANEVAL_PLUS", "MBPP_PLUS", "PLUS_VERSION", "load_plus_humaneval", "load_plus_mbpp", "grade_plus",
           "expected_outputs", "describe_plus", "GroundTruthError"]

PLUS_VERSION = "evalplus-2"   # 2: evalplus's own loading and checking

_FIELDS_PLUS = ("task_id", "prompt", "entry_point", "canonical_solution", "base_input", "plus_input", "atol",
                "contract")


def _evalplus():
    """The evalplus package (data loading, checking, special oracles), imported on first use."""
    try:
        import evalplus
        import evalplus.config
        import evalplus.data
        import evalplus.eval
        import evalplus.eval._special_oracle
    except ImportError as e:
        raise ImportError(f"humaneval_plus / mbpp_plus need the evalplus package ({e}): "
                          f"pip install 'thinking-seeds[evalplus]'") from None
    return evalplus


def _check_plus_file(file: Path) -> None:
    """Every line of an EvalPlus data file has its fields, and task ids are unique (errors name FILE:LINE)."""
    seen: dict[str, int] = {}
    for where, lineno, r in read_rows(file, what="problems file"):
        missing = [k for k in _FIELDS_PLUS if k not in r]
        if missing:
            raise ValueError(f"{where}: missing field(s) {missing}; an EvalPlus record has {list(_FIELDS_PLUS)} "
                             f"(is this HumanEvalPlus.jsonl / MbppPlus.jsonl?)")
        bad = [k for k in ("task_id", "prompt", "entry_point", "canonical_solution", "contract")
               if not isinstance(r[k], str)]
        bad += [k for k in ("base_input", "plus_input") if not isinstance(r[k], list)
                or not all(isinstance(a, list) for a in r[k])]
        if not isinstance(r["atol"], (int, float)) or isinstance(r["atol"], bool):
            bad.append("atol")
        if bad:
            raise ValueError(f"{where} ({r.get('task_id')}): malformed field(s) {bad} (strings; inputs are lists "
                             f"of argument lists; atol a number)")
        if r["task_id"] in seen:
            raise ValueError(f"{where}: duplicate task_id {r['task_id']!r} (first on line {seen[r['task_id']]})")
        seen[r["task_id"]] = lineno


_LOAD_LOCK = threading.Lock()


def _load_evalplus(path, *, dataset: str) -> tuple[dict, dict]:
    """(task_id -> task, data source) through EvalPlus's own loader: ``get_human_eval_plus`` / ``get_mbpp_plus``
    (MBPP+: with its ``mbpp_deserialize_inputs``, tuples and sets where the tasks take them). A local file is
    handed to it as its override path; without one EvalPlus's default release is used (downloaded by EvalPlus into
    its cache when missing, i.e. online)."""
    ev = _evalplus()
    from evalplus.data import humaneval as ev_he, mbpp as ev_mbpp
    mod, var = (ev_he, "HUMANEVAL_OVERRIDE_PATH") if dataset == "humaneval" else (ev_mbpp, "MBPP_OVERRIDE_PATH")
    get = ev_he.get_human_eval_plus if dataset == "humaneval" else ev_mbpp.get_mbpp_plus
    get_hash = ev_he.get_human_eval_plus_hash if dataset == "humaneval" else ev_mbpp.get_mbpp_plus_hash
    release = ev_he.HUMANEVAL_PLUS_VERSION if dataset == "humaneval" else ev_mbpp.MBPP_PLUS_VERSION
    if path is not None:
        _check_plus_file(Path(path))
    with _LOAD_LOCK:
        old = getattr(mod, var)
        setattr(mod, var, str(path) if path is not None else old)
        try:
            tasks, md5 = get(), get_hash()
        except AssertionError as e:   # evalplus's completeness_check
            raise ValueError(f"{path or 'EvalPlus data'}: {e}") from None
        except OSError as e:
            raise FileNotFoundError(f"{dataset}+: EvalPlus could not read or download its data ({e}); pass a local "
                                    f"file with --problems or set {DATA_ENV}") from None
        finally:
            setattr(mod, var, old)
    source = {"loader": f"evalplus {ev.__version__}", "dataset": "HumanEvalPlus" if dataset == "humaneval"
              else "MbppPlus", "path": str(Path(path).resolve()) if path is not None else None,
              "release": None if path is not None else release, "md5": md5, "tasks": len(tasks)}
    return tasks, source


def _resolve_plus(path, *, name: str, folder: str, files: list[str]) -> Path | None:
    """An explicit path, else ``$THINKING_SEEDS_DATA/code/<folder>/<file>`` when present, else None (EvalPlus's
    own default release)."""
    if path is not None:
        if not Path(path).is_file():
            raise FileNotFoundError(f"{name}: problems file {path} does not exist")
        return Path(path)
    root = os.environ.get(DATA_ENV)
    if root:
        for f in files:
            p = Path(root) / "code" / folder / f
            if p.is_file():
                return p
    return None


def _plus_problems(tasks: dict, source: dict, *, dataset: str) -> list[Problem]:
    from evalplus.eval._special_oracle import MBPP_OUTPUT_NOT_NONE_TASKS
    problems = []
    for task_id, t in tasks.items():
        problems.append(Problem(
            id=task_id, question=t["prompt"],
            gold={"dataset": dataset, "prompt": t["prompt"], "entry_point": t["entry_point"],
                  "canonical": t["prompt"] + t["canonical_solution"],   # EvalPlus's get_groundtruth, both datasets
                  "base_input": t["base_input"], "plus_input": t["plus_input"], "atol": t["atol"],
                  "output_not_none": dataset == "mbpp" and t["entry_point"] in MBPP_OUTPUT_NOT_NONE_TASKS,
                  "mbpp": dataset == "mbpp"},
            meta={"n_inputs": len(t["base_input"]) + len(t["plus_input"]), "source": source}))
    return problems


def load_plus_humaneval(path: str | os.PathLike | None = None) -> list[Problem]:
    file = _resolve_plus(path, name="humaneval_plus", folder="humaneval_plus",
                         files=["HumanEvalPlus.jsonl.gz", "HumanEvalPlus.jsonl"])
    return _plus_problems(*_load_evalplus(file, dataset="humaneval"), dataset="humaneval")


def load_plus_mbpp(path: str | os.PathLike | None = None) -> list[Problem]:
    file = _resolve_plus(path, name="mbpp_plus", folder="mbpp_plus", files=["MbppPlus.jsonl.gz", "MbppPlus.jsonl"])
    return _plus_problems(*_load_evalplus(file, dataset="mbpp"), dataset="mbpp")


class GroundTruthError(RuntimeError):
    """The canonical solution could not produce the expected outputs (it raised, or overran): the problem cannot
    be graded. EvalPlus itself stops the whole evaluation there; here its samples become ``grader_error``."""


_EXPECTED: dict[tuple[str, int], dict | GroundTruthError] = {}
_EXPECTED_LOCK = threading.Lock()


def _harness_files() -> list[tuple[str, str]]:
    """EvalPlus's own execution helpers (reliability_guard, swallow_io, time_limit), loaded in the sandbox."""
    ev = _evalplus()
    return [("evalplus_utils", str(Path(ev.__file__).parent / "eval" / "utils.py"))]


_PLUS_PREIMPORT = ("copy", "contextlib", "faulthandler", "io", "platform", "signal", "tempfile", "shutil",
                   "subprocess", "resource", "time")


def _json_size(x) -> int:
    """About the bytes of ``x`` (tagged JSON data) as a record: integers by their bit length (never converted, they
    may pass Python's str conversion limit), strings as JSON writes them."""
    if isinstance(x, bool) or x is None:
        return 5
    if isinstance(x, int):
        return x.bit_length() * 30103 // 100000 + 2
    if isinstance(x, float):
        return 24
    if isinstance(x, str):
        return len(json.dumps(x))
    if isinstance(x, list):
        return 2 + sum(_json_size(v) + 2 for v in x)
    if isinstance(x, dict):
        return 2 + sum(_json_size(k) + _json_size(v) + 4 for k, v in x.items())
    return 32


def _opaque(x) -> Opaque | None:
    """The first ``Opaque`` in a decoded value (containers, dict keys and values), or None."""
    stack = [x]
    while stack:
        v = stack.pop()
        if isinstance(v, Opaque):
            return v
        if isinstance(v, dict):
            stack += [*v.keys(), *v.values()]
        elif isinstance(v, (list, tuple, set, frozenset)):
            stack += list(v)
    return None


def expected_outputs(problem: Problem) -> dict:
    """``{"base": [...], "base_time": [...], "base_bytes": [...], "plus": ..., "plus_time": ..., "plus_bytes": ...}``:
    the canonical solution's outputs, times and record sizes, computed like EvalPlus's ``get_groundtruth`` (its
    ``trusted_exec``: a deepcopy of each input, timed; MBPP+'s output-not-None tasks keep ``out is not None``), but
    inside the sandbox, once per problem. Raises ``GroundTruthError`` (cached too) when the canonical solution fails,
    or returns a value the sandbox does not carry (an ``Opaque``, equal to nothing: no candidate could pass)."""
    g = problem.gold
    key = (problem.id, hash((g["canonical"], repr(g["base_input"])[:1000], len(g["plus_input"]))))
    with _EXPECTED_LOCK:
        if key in _EXPECTED:
            got = _EXPECTED[key]
            if isinstance(got, GroundTruthError):
                raise got
            return got
    parts = ("base", "plus")
    payloads = [{"inputs": encode_tagged(g[f"{part}_input"]), "trusted": True,
                 "output_not_none": g["output_not_none"]} for part in parts]
    packages, preimport = program_packages(g["canonical"])
    results = run_harness(g["canonical"], payloads, harness="evalplus", fn_name=g["entry_point"],
                          options={"max_memory_bytes": CODE_LIMITS.evalplus_memory_mb << 20},
                          timeout_s=CODE_LIMITS.evalplus_ground_truth_s, memory_mb=CODE_LIMITS.evalplus_memory_mb,
                          max_output_bytes=1 << 30, packages=packages, preimport=(*_PLUS_PREIMPORT, *preimport))
    out: dict = {}
    error = None
    for part, r in zip(parts, results):
        n = len(g[f"{part}_input"])
        recs = r.value if r.value_ok else []
        bad = next((x for x in recs if x.get("s") != "ok"), None)
        if bad is not None or len(recs) != n:
            what = (f"raised on {part} input {bad['i'] + 1} of {n}: {bad.get('e')}" if bad is not None else
                    f"stopped after {len(recs)} of {n} {part} inputs ({r.status}: {r.detail}; {r.stderr[-300:]})")
            error = GroundTruthError(f"{problem.id}: the canonical solution {what}")
            break
        out[part] = [decode_tagged(x["v"]) for x in recs]
        out[f"{part}_time"] = [float(x["t"]) for x in recs]
        out[f"{part}_bytes"] = [_json_size(x["v"]) for x in recs]
        k, opaque = next(((k, o) for k, o in enumerate(map(_opaque, out[part])) if o is not None), (0, None))
        if opaque is not None:
            error = GroundTruthError(f"{problem.id}: the canonical solution returned a {opaque.type_name} on {part} "
                                     f"input {k + 1} of {n}, a type the sandbox does not carry: no value can equal it")
            break
    with _EXPECTED_LOCK:
        _EXPECTED[key] = error if error is not None else out
    if error is not None:
        raise error
    return out


_REPLAY: list = []


class _Raised:
    """An input on which the candidate raised or ran out of time in the sandbox: the replay raises again."""

    def __init__(self, text: str):
        self.text = text


def _replay_call(*args):
    """The "candidate" EvalPlus checks in the replay: it returns, in order, what the real candidate returned in
    the sandbox (or raises where it raised)."""
    value = _REPLAY.pop(0)
    if isinstance(value, _Raised):
        raise RuntimeError(value.text)
    return value


def _replay_check(dataset: str, entry_point: str, inputs: list, expected: list, atol, ref_time: list,
                  outputs: list) -> tuple[str, list[bool]]:
    """EvalPlus's ``untrusted_check`` on the candidate's recorded outputs (pool worker function): its own
    comparison, special oracles and type/tolerance rules decide, in its own forked process; the candidate's code
    never runs here."""
    from evalplus.eval import untrusted_check
    os.environ["EVALPLUS_MAX_MEMORY_BYTES"] = "-1"   # the replay holds data only; the sandbox limited the candidate
    _REPLAY[:] = list(outputs)
    code = f"from {__name__} import _replay_call as {entry_point}\n"
    me = multiprocessing.current_process()
    daemon, method = me._config.get("daemon"), multiprocessing.get_start_method(allow_none=True)
    me._config["daemon"] = False   # a pool worker is a daemon process, and untrusted_check starts a process...
    multiprocessing.set_start_method("fork", force=True)   # ...by fork (this worker is single-threaded), which
    try:                                                    # hands it the outputs in _REPLAY
        stat, details = untrusted_check(dataset, code, inputs, entry_point, expected=expected, atol=atol,
                                        ref_time=ref_time, fast_check=True)
    finally:
        me._config["daemon"] = daemon
        multiprocessing.set_start_method(method, force=True)
    return stat, [bool(x) for x in details]


_CHECK_POOL = None
_CHECK_LOCK = threading.Lock()


def _check(*args) -> tuple[str, list[bool]]:
    """Run ``_replay_check`` in a small worker process (forkserver: the replay forks, and a grader process holding
    a model and threads must not be forked); one check at a time through the shared pool. In a grading pool's
    worker (a daemon process: it may not start a pool, and it is single-threaded and holds no model) the replay
    runs right there, under that pool's hard limit."""
    global _CHECK_POOL
    if multiprocessing.current_process().daemon:
        return _replay_check(*args)
    with _CHECK_LOCK:
        if _CHECK_POOL is None:
            _CHECK_POOL = WorkerPool(apply, workers=1, timeout=CODE_LIMITS.evalplus_task_s + 30,
                                     preload=("evalplus.eval", "numpy"))
            atexit.register(_CHECK_POOL.close)
        [res] = _CHECK_POOL.map([(apply, _replay_check, *args)])
    if res.status != "ok":
        raise RuntimeError(f"the EvalPlus check failed ({res.status}): {res.detail[-500:]}")
    return res.value


def _limits(ref_time: list[float]) -> tuple[list[float], float]:
    """EvalPlus's per-input time limits, ``max(min_time_limit, gt_time_limit_factor * t)``, and the limit of the
    whole check (``untrusted_check`` joins its process after ``min(60, sum) + 1`` + 1 s)."""
    from evalplus.config import DEFAULT_GT_TIME_LIMIT_FACTOR, DEFAULT_MIN_TIME_LIMIT
    limits = [max(DEFAULT_MIN_TIME_LIMIT, DEFAULT_GT_TIME_LIMIT_FACTOR * t) for t in ref_time]
    return limits, min(CODE_LIMITS.evalplus_task_s, sum(limits)) + 2


_RECORD_VERDICT = {"timeout": "time_limit", "memory": "memory_limit", "error": "runtime_error",
                   "fatal": "runtime_error", "output_limit": "wrong_answer"}


def _plus_part(program: str, problem: Problem, part: str, expected: dict) -> Verdict | None:
    """The candidate on the ``base`` or ``plus`` inputs; None when EvalPlus's check passes."""
    g = problem.gold
    inputs, exp, times = g[f"{part}_input"], expected[part], expected[f"{part}_time"]
    n = len(inputs)
    if n == 0:
        return None
    limits, overall = _limits(times)
    packages, preimport = program_packages(program)
    tagged = encode_tagged(inputs)
    # the records' cap, sized from the gold as LiveCodeBench's is: per input twice the gold and the input (a function
    # may return its input) plus 4 KiB, at least 1 MiB; past it the record is output_limit, a wrong answer
    cap = max(DEFAULT_MAX_OUTPUT, sum(2 * (size + _json_size(inp)) + 4096
                                      for size, inp in zip(expected[f"{part}_bytes"], tagged)))
    [r] = run_harness(program, [{"inputs": tagged, "limits": limits}], harness="evalplus",
                      fn_name=g["entry_point"], options={"max_memory_bytes": CODE_LIMITS.evalplus_memory_mb << 20},
                      timeout_s=overall, memory_mb=CODE_LIMITS.evalplus_memory_mb, max_output_bytes=cap,
                      packages=packages, preimport=(*_PLUS_PREIMPORT, *preimport), load_files=_harness_files())
    if not r.value_ok:   # records the program's process wrote that do not read (too deep, too long a number...)
        name = "runtime_error" if r.status == "ok" else verdict_of_status(r.status)
        return Verdict(False, name, None, f"{part} input 1/{n}: {name}: {r.detail}")
    recs = r.value
    outputs: list = []
    for i, rec in enumerate(recs):
        if rec.get("i") != i or rec.get("s") not in ("ok", *_RECORD_VERDICT):
            return Verdict(False, "runtime_error", None, f"{part} input {i + 1}/{n}: malformed harness record")
        if rec.get("stage") == "load":
            return Verdict(False, "runtime_error", None, f"the program failed to load: {rec.get('e', '')}")
        if rec["s"] != "ok":
            outputs.append(_Raised(rec.get("e", rec["s"])))
            break
        try:
            outputs.append(decode_tagged(rec.get("v")))
        except (ValueError, TypeError, KeyError) as e:
            return Verdict(False, "runtime_error", None, f"{part} input {i + 1}/{n}: malformed value: {e}")
    if len(outputs) < n and (not outputs or not isinstance(outputs[-1], _Raised)):
        outputs.append(_Raised(f"the process ended ({r.status}: {r.detail})"))
    stat, details = _check(g["dataset"], g["entry_point"], inputs, exp, g["atol"], times, outputs)
    if stat == "pass":
        return None
    k = min(max(len(details) - 1, 0), len(outputs) - 1)   # fast_check: the last detail is the failing input
    where = f"{part} input {k + 1}/{n}"
    if isinstance(outputs[k], _Raised):
        rec = recs[k] if k < len(recs) else None
        if rec is not None:
            return Verdict(False, _RECORD_VERDICT[rec["s"]], None, f"{where}: {outputs[k].text}")
        name = "time_limit" if r.status in ("ok", "time_limit") else verdict_of_status(r.status)
        return Verdict(False, name, None, f"{where}: {outputs[k].text}")
    if stat == "timeout":
        return Verdict(False, "time_limit", None, f"{where}: EvalPlus check timed out")
    return Verdict(False, "wrong_answer", None, f"{where}: returned {short_repr(outputs[k])}, expected "
                                                f"{short_repr(exp[k]) if k < len(exp) else '?'}")


def grade_plus(response: str, problem: Problem) -> Verdict:
    """EvalPlus's verdict for one response: the candidate passes its base inputs, then its plus inputs (pass@1 of
    HumanEval+/MBPP+ is "base and plus both pass"). The candidate runs in the sandbox under EvalPlus's own
    execution helpers and per-input time limits; EvalPlus's ``untrusted_check`` compares its outputs.
    ``GroundTruthError`` propagates (the problem cannot be graded; ``eval.run`` records ``grader_error``)."""
    g = problem.gold
    if g["mbpp"]:
        program = sanitize(extract_code(response))
    else:
        program = extract_completion(response, g["prompt"], g["entry_point"])
    if not program.strip():
        return Verdict(False, "no_answer", None, "no program in the response")
    expected = expected_outputs(problem)
    for part in ("base", "plus"):
        v = _plus_part(program, problem, part, expected)
        if v is not None:
            return v
    n = len(g["base_input"]) + len(g["plus_input"])
    return Verdict(True, "pass", None, f"{n}/{n} inputs")


def describe_plus(problems: list[Problem], path=None, **_) -> dict:
    """EvalPlus's loader, dataset, release (or the local file) and md5 (EvalPlus's own dataset hash)."""
    return dict(problems[0].meta["source"]) if problems else {}


HUMANEVAL_PLUS = Benchmark(
    name="humaneval_plus", version=PLUS_VERSION, kind="code", load=load_plus_humaneval, grade=grade_plus,
    default_template="raw", generation=dict(CODE_GENERATION), describe=describe_plus,
    description="EvalPlus HumanEval+ (evalplus's data loading and checking; base + plus inputs in the sandbox)")

MBPP_PLUS = Benchmark(
    name="mbpp_plus", version=PLUS_VERSION, kind="code", load=load_plus_mbpp, grade=grade_plus,
    default_template="raw", generation=dict(CODE_GENERATION), describe=describe_plus,
    description="EvalPlus MBPP+ (evalplus's data loading, input deserialisation and checking; in the sandbox)")

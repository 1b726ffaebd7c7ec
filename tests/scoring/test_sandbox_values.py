"""A reward an RL policy cannot game: what a program returns is compared as a value, and nothing it writes makes
it ungraded. Each attack is a short program run through the real sandbox on the path that grades it.

Values (EvalPlus, ``protocol.encode_tagged``): ``collections``' dict subclasses cross with their items and their
type (told by the class's identity, never its name) and compare as EvalPlus compares them in-process; a value of any
other type is an ``Opaque`` that equals nothing, so neither a truncated repr nor a class named ``Counter`` decides.

Ungradable records (``host.parse_json``, ``protocol.decode_tagged``): a record nested past ``MAX_JSON_DEPTH``, an
integer of more than ``MAX_INT_DIGITS`` digits or a numpy value larger than the data it carries is the program's
failure, read in linear time without allocating, never a ``grader_error`` (which would drop the sample, and in
training its whole group).
"""

from __future__ import annotations

import functools
import json
import time
import tracemalloc
from collections import Counter, OrderedDict, defaultdict

import pytest

from scoring import sandbox as sb
from scoring.benchmarks import evalplus_plus as ep
from scoring.benchmarks.base import Problem
from scoring.code import grade_code
from scoring.sandbox import host
from scoring.sandbox.protocol import Opaque, decode_tagged

ISO = sb.isolation()
full = pytest.mark.skipif(not ISO.full, reason=f"needs full sandbox isolation: {ISO.reason}")

# MBPP+'s Mbpp/88 (freq_count): the canonical solution returns a collections.Counter; the task asks for "a
# dictionary". 60 keys: the Counter's repr runs to ~370 characters.
XS = list(range(60)) + [0, 1]
FREQ = "import collections\ndef freq_count(xs):\n    return collections.Counter(xs)\n"


def _problem(canonical: str, entry: str, inputs: list, pid: str = "Mbpp/88") -> Problem:
    """An MBPP+ problem as ``evalplus_plus`` loads one (no special oracle, exact match)."""
    return Problem(id=pid, question="", gold={"dataset": "mbpp", "prompt": "", "entry_point": entry,
                                              "canonical": canonical, "base_input": inputs, "plus_input": [],
                                              "atol": 0, "output_not_none": False, "mbpp": True})


def _grade_all(programs: list[str], problem: Problem) -> list[str]:
    got = sb.run_many([functools.partial(ep.grade_plus, f"```python\n{p}\n```", problem) for p in programs],
                      workers=2)
    return [v.verdict for v in got]


# ---- values compared as values ---------------------------------------------------------------------------------

def test_a_counter_is_compared_on_all_its_items_not_a_truncated_repr():
    """A wrong Counter that agrees with the gold's repr for 200 characters, and an object of a class named Counter
    whose repr is the gold's, both passed when values crossed as (type name, repr[:200]); a correct plain dict
    failed against the Counter gold, where EvalPlus passes it (Counter == dict compares as dicts)."""
    gold = Counter(XS)
    wrong = Counter(XS)
    wrong[-1] = 1
    assert repr(wrong)[:200] == repr(gold)[:200] and wrong != gold
    programs = {
        "correct Counter": FREQ,
        "wrong after char 200": "import collections\ndef freq_count(xs):\n    c = collections.Counter(xs)\n"
                                "    c[-1] = 1\n    return c\n",
        "named Counter, right repr": "import collections\nclass Counter:\n    def __init__(self, text):\n"
                                     "        self.text = text\n    def __repr__(self):\n        return self.text\n"
                                     "def freq_count(xs):\n    return Counter(repr(collections.Counter(xs)))\n",
        "plain dict": "def freq_count(xs):\n    d = {}\n    for x in xs:\n        d[x] = d.get(x, 0) + 1\n"
                      "    return d\n",
        "Counter subclass": "import collections\nclass C(collections.Counter):\n    pass\n"
                            "def freq_count(xs):\n    return C(xs)\n",
    }
    problem = _problem(FREQ, "freq_count", [[XS]])
    got = dict(zip(programs, _grade_all(list(programs.values()), problem)))
    assert got == {"correct Counter": "pass", "wrong after char 200": "wrong_answer",
                   "named Counter, right repr": "wrong_answer", "plain dict": "pass",
                   "Counter subclass": "wrong_answer"}   # a program's class is never trusted, whatever its base
    [e] = ep.expected_outputs(problem)["base"]
    assert type(e) is Counter and e == gold


def test_ordered_dict_and_defaultdict_round_trip_with_their_type():
    """Golds of the three trusted dict subclasses come back as themselves (the canonical solution's path), and a
    candidate is compared as EvalPlus compares in-process: OrderedDict against OrderedDict in order, a defaultdict
    or a dict against either as a dict."""
    od = ("import collections\ndef f(xs):\n    return collections.OrderedDict((x, i) for i, x in enumerate(xs))\n")
    dd = ("import collections\ndef f(xs):\n    d = collections.defaultdict(list)\n    for x in xs:\n"
          "        d[x % 3].append(x)\n    return d\n")
    xs = [[[5, 1, 4, 2]]]
    e_od = ep.expected_outputs(_problem(od, "f", xs, "Mbpp/od"))["base"][0]
    e_dd = ep.expected_outputs(_problem(dd, "f", xs, "Mbpp/dd"))["base"][0]
    assert type(e_od) is OrderedDict and list(e_od.items()) == [(5, 0), (1, 1), (4, 2), (2, 3)]
    assert type(e_dd) is defaultdict and e_dd == {2: [5, 2], 1: [1, 4]} and e_dd.default_factory is None
    reversed_od = ("import collections\ndef f(xs):\n    return collections.OrderedDict(reversed([(x, i) for i, x "
                   "in enumerate(xs)]))\n")
    plain = "def f(xs):\n    return {x: i for i, x in enumerate(xs)}\n"
    assert _grade_all([od, reversed_od, plain], _problem(od, "f", xs, "Mbpp/od")) == \
        ["pass", "wrong_answer", "pass"]   # OrderedDict == OrderedDict is order-sensitive; against a dict it is not
    as_dict = "def f(xs):\n    d = {}\n    for x in xs:\n        d.setdefault(x % 3, []).append(x)\n    return d\n"
    assert _grade_all([dd, as_dict], _problem(dd, "f", xs, "Mbpp/dd")) == ["pass", "pass"]


def test_an_opaque_value_equals_nothing_and_names_are_not_types():
    a, b = Opaque("Counter", "Counter({1: 1})"), Opaque("Counter", "Counter({1: 1})")
    assert a != b and not a == b and a != Counter({1: 1}) and Counter({1: 1}) != a and not a == a
    with pytest.raises(ValueError, match="unknown dict type"):
        decode_tagged({"__dictsub__": ["__main__.Counter", []]})
    assert decode_tagged({"__dictsub__": ["collections.Counter", [[1, 2]]]}) == Counter({1: 2})
    for malformed in ({"__complex__": []}, {"__dict__": [[[1], 2]]}, {"__set__": [[1]]}, {"__tuple__": 3},
                      {"__bytes__": 5}, {"__dictsub__": ["collections.Counter"]}):
        with pytest.raises(ValueError):
            decode_tagged(malformed)


# ---- nothing a program writes makes it ungraded ----------------------------------------------------------------

DEEP = ("    import sys\n    sys.setrecursionlimit(100000)\n    v = []\n    for _ in range(5000):\n"
        "        v = [v]\n    return v\n")


@full
def test_a_deeply_nested_return_is_the_programs_failure():
    """A list nested 5,000 deep raised RecursionError in the grader's json.loads: an exception out of the grader
    (``grader_error``: the sample left every score, training dropped its whole group). Now the record is refused
    before it is parsed: the program's runtime_error, on LiveCodeBench's harness and on EvalPlus's."""
    v = grade_code(f"def f(x):\n{DEEP}", [{"input": "1", "output": "1"}], kind="functional", fn_name="f")
    assert v.verdict == "runtime_error" and "nested deeper than 100" in v.detail, v
    [verdict] = _grade_all([f"def freq_count(xs):\n{DEEP}"], _problem(FREQ, "freq_count", [[XS]]))
    assert verdict == "runtime_error"


@full
@pytest.mark.parametrize("path", ["lcb", "evalplus"])
def test_a_four_million_digit_record_gets_its_verdict_in_seconds(path):
    """A record holding a 4,000,000-digit integer (written by the program itself on the harness's record
    descriptor) kept the grader in int(Decimal(s)), quadratic, for minutes. Integers past LiveCodeBench's 50,000
    digits are refused as they are read (and EvalPlus's records are capped at twice the gold's size)."""
    write = ("    import os\n    os.write(3, b'{\"i\": 0, \"s\": \"ok\", \"v\": ' + b'9' * 4000000 + b'}\\n')\n"
             "    os._exit(0)\n")
    t0 = time.monotonic()
    if path == "lcb":
        v = grade_code(f"import os\nos.write(3, b'{{\"i\": 0, \"s\": \"ok\", \"v\": ' + b'9' * 4000000 + b'}}\\n')\n"
                       f"os._exit(0)\n", [{"input": "1", "output": "1"}], kind="functional", fn_name="f")
        verdict = v.verdict
    else:
        [verdict] = _grade_all([f"def freq_count(xs):\n{write}"], _problem(FREQ, "freq_count", [[XS]]))
    assert verdict in ("runtime_error", "wrong_answer")
    assert time.monotonic() - t0 < 20   # a sandbox call or two; the record's parse itself takes milliseconds


@full
@pytest.mark.parametrize("dtype,data,want", [("(1000,1000,60)<f8", 0, "runtime_error"),   # refused
                                             ("<U100000000", "x", "wrong_answer")])       # the str 'x'
def test_a_numpy_record_larger_than_its_data_allocates_nothing(dtype, data, want):
    """A ~70-byte record asked the grader for a 458 MB (subarray dtype) or 400 MB (string width) array. A numpy
    value is rebuilt only from the elements it carries, in the shape they fill, sized by the data."""
    rec = json.dumps({"i": 0, "s": "ok", "v": {"__numpy__": [dtype, [], data]}}).encode()
    program = f"def freq_count(xs):\n    import os\n    os.write(3, {rec!r} + b'\\n')\n    os._exit(0)\n"
    problem = _problem(FREQ, "freq_count", [[XS]])
    ep.expected_outputs(problem)   # the gold, before the measured window
    tracemalloc.start()
    try:
        [verdict] = _grade_all([program], problem)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert verdict == want
    assert peak < 50 << 20, f"the grader allocated {peak / 2**20:.0f} MB for a {len(rec)}-byte record"


def test_parse_json_bounds_what_a_program_can_make_the_grader_do():
    deep = "[" * 5000 + "]" * 5000
    with pytest.raises(ValueError, match="nested deeper than 100"):
        host.parse_json(deep)
    assert host.parse_json("[" * 100 + "]" * 100) is not None                  # 100 levels: accepted
    assert host.parse_json('["' + "[" * 5000 + '"]') == ["[" * 5000]           # brackets in strings do not count
    assert host.parse_json('"\\"[[["') == '"[[['                               # nor after an escaped quote
    assert host.parse_json("9" * 50000) == 10 ** 50000 - 1 and host.parse_json("-" + "9" * 50000) == 1 - 10 ** 50000
    assert host.parse_json("12345678901234567890" * 250) % 10 ** 20 == 12345678901234567890   # 5,000 digits, halves
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="50001 digits"):
        host.parse_json("9" * 50001)
    with pytest.raises(ValueError, match="4000000 digits"):
        host.parse_json('{"v": ' + "9" * 4_000_000 + "}")
    assert time.perf_counter() - t0 < 2.0


def _never_returns(response, problem):
    """A code grader that hangs (module level: the pool's workers import it by reference)."""
    time.sleep(3600)


@pytest.mark.slow   # over 1.5 s of sandboxed processes or a subprocess
def test_evals_code_grading_has_a_hard_bound_per_sample():
    """eval grades code in worker processes with a hard limit per sample (``grade_responses``): a grader that
    never returns is that sample's ``timeout`` (ungraded), the others are graded, and nothing hangs."""
    import dataclasses

    from scoring.benchmarks.protocol import grade_responses
    from scoring.benchmarks.tasks import MINICODE
    bench = dataclasses.replace(MINICODE, grade=_never_returns)
    t0 = time.monotonic()
    [[a, b]], _, _ = grade_responses(bench, [Problem("p", "q", None)], [["x", "y"]], code_timeout_s=2.0)
    assert (a.verdict, b.verdict) == ("timeout", "timeout") and time.monotonic() - t0 < 60

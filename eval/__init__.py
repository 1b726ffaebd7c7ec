"""Score checkpoints the way the paper does: avg@32 and pass@k on six math benchmarks and on code benchmarks.

- ``eval.benchmarks``: one module per benchmark and the explicit registry (``get_benchmark``);
- grading, templates and the sandbox live one layer down, in ``scoring`` (``scoring.math``, ``scoring.qwen``,
  ``scoring.pool``, ``scoring.code``, ``scoring.sandbox``, ``scoring.templates``), shared with the trainer's rewards;
- ``eval.metrics``: avg@n, pass@k, bootstrap intervals, paired comparisons (estimators from ``contracts.passk``);
- ``eval.run``: ``run_eval`` (the library entry) and the runner CLI over it (``python -m eval.run``) writing ``results/eval/<model>/<benchmark>.jsonl``;
- ``eval.leaderboard``: models side by side (``python -m eval.leaderboard results/eval``);
- ``eval.lm_eval_bridge``: lm-evaluation-harness tasks into the same leaderboard.
"""

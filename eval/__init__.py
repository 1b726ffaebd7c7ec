"""Score checkpoints the way the paper does: avg@32 and pass@k on six math benchmarks and on code benchmarks.

- ``scoring.benchmarks``: one module per benchmark and the explicit registry (``get_benchmark``);
- grading, templates and the sandbox live one layer down, in ``scoring`` (``scoring.math``, ``scoring.qwen``,
  ``scoring.pool``, ``scoring.grading`` (the one batch grader), ``scoring.code``, ``scoring.sandbox``,
  ``scoring.templates``), shared with the trainer's rewards;
- ``eval.metrics``: avg@n, pass@k, bootstrap intervals, paired comparisons (estimators from ``contracts.passk``);
- ``eval.config``: ``EvalConfig``, the one validated config (presets in ``eval/configs/``);
- ``eval.run``: ``run_eval(cfg)`` (the library entry) and the runner CLI over it (``python -m eval.run``) writing
  ``results/eval/<model>/<benchmark>.jsonl``; ``eval.inputs`` (model, problems, samples and results-file checks),
  ``eval.grading`` (batch grading, regrading, the disagreements file), ``eval.report`` (a file's scores and line),
  ``eval.parallel`` (engines in this or D processes); the results-file format is ``contracts.samples`` (read by
  ``tsanalysis`` and the demo too);
- ``eval.leaderboard``: models side by side (``python -m eval.leaderboard results/eval``);
- ``eval.lm_eval_bridge``: lm-evaluation-harness tasks into the same leaderboard.
"""

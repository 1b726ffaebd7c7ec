"""Score checkpoints the way the paper does: avg@32 and pass@k on six math benchmarks and on code benchmarks.

- ``eval.benchmarks``: one module per benchmark and the explicit registry (``get_benchmark``);
- ``scoring.templates``: prompt templates (``render_prompt``);
- ``eval.grading``: math (math-verify, a Qwen-style cross-check, a process pool with hard timeouts) and code;
- ``eval.metrics``: avg@n, pass@k, bootstrap intervals, paired comparisons;
- ``eval.run``: the runner CLI (``python -m eval.run``) writing ``results/eval/<model>/<benchmark>.jsonl``;
- ``eval.leaderboard``: models side by side (``python -m eval.leaderboard results/eval``);
- ``eval.lm_eval_bridge``: lm-evaluation-harness tasks into the same leaderboard.
"""

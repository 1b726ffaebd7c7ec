"""The miniature reproduction of the paper on CPU: ``python -m demo [--quick]`` (see ``demo.pipeline``).

``demo.pipeline`` runs the stages (warm-up, RL runs, held-out eval, relay, analyses and figures, summary);
``demo.miniature`` repeats the training and evaluation over several seeds and writes ``docs/miniature.md``.
"""

from demo.pipeline import BUDGETS, FULL, METHODS, QUICK, Budget, DemoError, RunSpec, run_demo

__all__ = ["BUDGETS", "FULL", "METHODS", "QUICK", "Budget", "DemoError", "RunSpec", "run_demo"]

"""The miniature reproduction of the paper on CPU: ``python -m demo [--quick]`` (see ``demo.addition``).

``demo.addition`` runs the stages (warm-up, RL runs, held-out eval, relay, analyses and figures, summary);
``demo.miniature`` repeats the training and evaluation over several seeds and writes ``docs/miniature.md``.
"""

from demo.addition import BUDGETS, FULL, METHODS, QUICK, Budget, run_demo
from demo.common import DemoError, RunSpec

__all__ = ["BUDGETS", "FULL", "METHODS", "QUICK", "Budget", "DemoError", "RunSpec", "run_demo"]

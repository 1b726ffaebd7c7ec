"""``python -m demo [--quick] [--out DIR] [--seeds N] [--fresh]``: the miniature reproduction, end to end on CPU.

Builds a tiny model, warms it up on the embedded addition task, trains on-policy DAPO (with and without
mini-batching), Thinking Seeds (ratio and entropy rules; state+action and state; the Figure 4 run), LUFFY and
M2PO with matched budgets, evaluates every final checkpoint and the warm-up on the held-out split through
``eval.run``, runs relay inference between an early and the final on-policy checkpoint, computes the analyses
and draws Figures 2-5, then prints a leaderboard, the stage timings and every path it wrote.

Output: ``runs/demo`` (full: 6.2 minutes on 2 idle cores, measured; 9.5 before the flat forward; 17 minutes on
one busy core then) or
``runs/demo-quick`` (``--quick``, the same pipeline at toy size: 2.7 minutes on 2 idle cores in the test suite at
commit f4e2376, 4.1 on a slower AVX2 machine), or ``--out DIR``.
Stages whose outputs exist are skipped, so a rerun resumes; ``--fresh`` deletes the folder first.

``python -m demo --premise [options of python -m demo.premise]``: the paper's premise instead (RL narrows the
policy, the relay; countdown, about 30 minutes on 2 cores; ``runs/premise``, its page ``runs/premise/premise.md``).
"""

from __future__ import annotations

import argparse
import sys

import torch

from contracts.commands import EXIT_CODES_HELP, run_command
from demo.pipeline import BUDGETS, DemoError, auto_threads, run_demo
from demo.premise import main as premise_main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m demo", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1] + "\n" + EXIT_CODES_HELP)
    p.add_argument("--quick", action="store_true", help="toy size (about 3 minutes on 2 cores; more on slower ones); default output runs/demo-quick")
    p.add_argument("--out", default=None, help="output folder (default runs/demo, or runs/demo-quick with --quick)")
    p.add_argument("--seeds", type=int, default=1,
                   help="training seeds per method (seed 0 feeds the figures; others are named <method>-seed<k>)")
    p.add_argument("--fresh", action="store_true", help="delete the output folder first and redo every stage")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: 2 when the cores are idle, else 1; with other jobs on the cores "
                        "2 threads ran several times slower than 1)")
    p.add_argument("--progress", action="store_true", help="progress bars of the training runs")
    p.add_argument("--premise", action="store_true",
                   help="run demo.premise instead (the other options are then those of python -m demo.premise)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--premise" in argv:
        return premise_main([a for a in argv if a != "--premise"])
    args = build_parser().parse_args(argv)
    budget = BUDGETS["quick" if args.quick else "full"]
    out = args.out or ("runs/demo-quick" if args.quick else "runs/demo")
    if args.threads is not None and args.threads < 1:
        build_parser().error("--threads must be >= 1")
    threads, why = (args.threads, "--threads") if args.threads else auto_threads()
    torch.set_num_threads(threads)
    print(f"torch threads: {threads} ({why})", flush=True)

    def body() -> int:
        result = run_demo(budget, out, seeds=args.seeds, fresh=args.fresh, progress=args.progress)
        print(f"\ndemo ({budget.name}) finished; everything is under {out}/ (summary: {result['paths']['summary'][0]})")
        return 0

    # contracts.commands: a DemoError (bad input, a folder of other settings) one line, exit 2; any other failure
    # one line, exit 1; Ctrl-C 130, SIGTERM 143: finished stages are kept and the same command skips them
    return run_command(body, input_errors=(DemoError,), resume=lambda: _resume(out), kept=lambda: _resume(out))


def _resume(out: str) -> str:
    return f"finished stages are kept in {out}/ and the same command resumes after them"


if __name__ == "__main__":
    sys.exit(main())

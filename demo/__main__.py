"""``python -m demo [--out DIR] [--seeds N] [--fresh] [--toy]``: the paper's point, end to end on CPU.

The main job (``demo.reduced``) runs the regime where the premise of the paper shows: countdown, whose problems
have several solutions; a tiny model warmed up on one random solution per problem; on-policy DAPO with an early
checkpoint, Thinking Seeds (ratio rule, state+action) and LUFFY with the same budget; every
model scored with n = 64 on 200 held-out problems (pass@k up to k = 64); the relay between the early and the final
on-policy checkpoint; the crossover k; Figures 2-5; and ``summary.md``, which leads with the narrowing, the relay's
gain at k = 64 and where each method sits at pass@1 and pass@64, saying plainly when an effect is within noise.
It is ``--premise`` with one training seed per method instead of three, and three of its eight rows (no entropy
rule, `state` variant, M2PO or restart rows; ``python -m demo.premise --budget reduced --methods ...`` adds rows). Output ``runs/demo`` (``--toy``: the same job at the tests' size, seconds; runs/demo-toy).

``--task addition``: the addition miniature of earlier versions (every method of Tables 1-2 and Figures 2-5 on the
embedded addition task, one solution per problem, where the premise does not show: 8 min 51 s on 2 idle cores on a
fresh clone, issue #27's measurement; output runs/demo-addition); ``--quick``: that pipeline at toy size (the tests'
run; runs/demo-quick).
``--premise [options of python -m demo.premise]``: the full premise regime (3 training seeds per method, about 90
minutes on 2 cores: docs/premise.md, Cost; runs/premise, its page runs/premise/premise.md).

Stages whose outputs exist are skipped, so a rerun resumes; ``--fresh`` deletes the folder first.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import torch

from contracts.commands import EXIT_CODES_HELP, run_command
from demo.addition import BUDGETS, run_demo
from demo.common import DemoError, auto_threads
from demo.premise import main as premise_main
from demo.premise_budget import BUDGETS as PREMISE_BUDGETS
from demo.reduced import SUMMARY, run_reduced


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m demo", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1] + "\n" + EXIT_CODES_HELP)
    p.add_argument("--task", choices=("countdown", "addition"), default=None,
                   help="countdown: the main job, the premise regime reduced (default); addition: the addition "
                        "miniature of earlier versions")
    p.add_argument("--toy", action="store_true", help="the main job at the tests' size (seconds); default output "
                                                      "runs/demo-toy")
    p.add_argument("--quick", action="store_true",
                   help="the addition miniature at toy size (about 3 minutes on 2 cores); default output "
                        "runs/demo-quick")
    p.add_argument("--out", default=None,
                   help="output folder (default runs/demo; runs/demo-toy, runs/demo-addition, runs/demo-quick)")
    p.add_argument("--seeds", type=int, default=1,
                   help="training seeds per method (1; 3 gives --premise's intervals over seeds for these rows)")
    p.add_argument("--fresh", action="store_true", help="delete the output folder first and redo every stage")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: 2 when the cores are idle, else 1; with other jobs on the cores "
                        "2 threads ran several times slower than 1)")
    p.add_argument("--progress", action="store_true", help="progress bars of the training runs (addition)")
    p.add_argument("--premise", action="store_true",
                   help="run demo.premise instead (the other options are then those of python -m demo.premise)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--premise" in argv:
        return premise_main([a for a in argv if a != "--premise"])
    parser = build_parser()
    args = parser.parse_args(argv)
    task = args.task or ("addition" if args.quick else "countdown")
    if args.quick and task != "addition":
        parser.error("--quick is the addition miniature at toy size; the main job at toy size is --toy")
    if args.toy and task != "countdown":
        parser.error("--toy is the countdown main job at toy size; the addition one is --quick")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    if task == "countdown":
        budget = replace(PREMISE_BUDGETS["toy" if args.toy else "reduced"], seeds=args.seeds)
        out = args.out or ("runs/demo-toy" if args.toy else "runs/demo")
    else:
        budget = BUDGETS["quick" if args.quick else "full"]
        out = args.out or ("runs/demo-quick" if args.quick else "runs/demo-addition")
    blocked = next((q for q in (Path(out), *Path(out).parents) if q.exists() and not q.is_dir()), None)
    if blocked is not None:   # bad input, said before anything runs (not "a failure inside the run ... resumes")
        parser.error(f"--out {out}: {blocked} is a file, not a folder; give a folder (it is created when missing)")
    threads, why = (args.threads, "--threads") if args.threads else auto_threads()
    torch.set_num_threads(threads)
    print(f"torch threads: {threads} ({why})", flush=True)

    def body() -> int:
        if task == "countdown":
            command = "python -m demo" + (" --toy" if args.toy else "") + (f" --seeds {args.seeds}" if args.seeds > 1
                                                                          else "") + (f" --out {args.out}" if args.out
                                                                                      else "")
            run_reduced(budget, out, fresh=args.fresh, command=command)
            print(f"\ndemo (countdown, budget {budget.name}) finished; everything is under {out}/ "
                  f"(summary: {out}/{SUMMARY})")
            return 0
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

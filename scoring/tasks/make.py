"""Write a task's examples to a JSONL data file (one row per line, written atomically: ``contracts.files``).

    python -m scoring.tasks.make --task addition --n 1000 --seed 0 --min-digits 2 --max-digits 3 --out data.jsonl
    python -m scoring.tasks.make --task countdown --n 500 --seed 1 --max-numbers 3 --out cd.jsonl

Difficulty options are the keywords of the task's ``make_examples`` (its ``DIFFICULTY`` dict); giving one
that belongs to another task is an error. Unset options keep the task's defaults.
"""

from __future__ import annotations

import argparse

from contracts.files import atomic_write_jsonl
from scoring.tasks import TASKS, get_task


def add_difficulty_args(parser: argparse.ArgumentParser) -> None:
    """One ``--min-digits``-style option per difficulty keyword of every task (default: unset)."""
    group = parser.add_argument_group("difficulty (task-specific; unset options keep the task's defaults)")
    seen: dict[str, list[str]] = {}
    for name, task in TASKS.items():
        for key in task.DIFFICULTY:
            seen.setdefault(key, []).append(name)
    for key, owners in seen.items():
        defaults = ", ".join(f"{t}: {TASKS[t].DIFFICULTY[key]}" for t in owners)
        group.add_argument("--" + key.replace("_", "-"), dest=key, type=int, default=None, help=f"default {defaults}")


def difficulty_from_args(task_name: str, args: argparse.Namespace) -> dict[str, int]:
    """The difficulty keywords set on the command line; errors on options of other tasks."""
    task = get_task(task_name)
    chosen, foreign = {}, []
    for name, other in TASKS.items():
        for key in other.DIFFICULTY:
            value = getattr(args, key, None)
            if value is None:
                continue
            if key in task.DIFFICULTY:
                chosen[key] = value
            elif key not in foreign:
                foreign.append(key)
    if foreign:
        opts = ", ".join("--" + k.replace("_", "-") for k in foreign)
        valid = ", ".join("--" + k.replace("_", "-") for k in task.DIFFICULTY)
        raise SystemExit(f"error: {opts} do not apply to task {task_name!r} (its options: {valid})")
    return chosen


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", required=True, choices=sorted(TASKS))
    parser.add_argument("--n", type=int, required=True, help="number of examples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="output .jsonl file")
    add_difficulty_args(parser)
    args = parser.parse_args(argv)
    difficulty = difficulty_from_args(args.task, args)
    try:
        rows = get_task(args.task).make_examples(args.n, seed=args.seed, **difficulty)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    out = atomic_write_jsonl(args.out, rows)
    print(f"wrote {len(rows)} {args.task} examples (seed {args.seed}, {difficulty or 'default difficulty'}) to {out}")


if __name__ == "__main__":
    main()

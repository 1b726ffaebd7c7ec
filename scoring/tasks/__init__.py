"""Tasks with verifiable rewards for the tiny-model trainer, tests and demo.

Each task module exposes ``make_examples(n, *, seed, **difficulty) -> list[dict]`` (rows with ``id``,
``prompt``, ``answer``, ``solution`` plus task fields; deterministic in the seed), ``reward(response,
example) -> float`` (1.0 or 0.0) and ``DIFFICULTY`` (the difficulty keywords and their defaults). The
``solution`` column is the task's own solver trace (``minicode``: its solver program; its rows also carry the
tests its reward runs in the sandbox): the target of supervised warm-up (``trainer.sft``) and
LUFFY's off-policy column. ``python -m scoring.tasks.make`` writes a JSONL data file.
"""

from types import ModuleType

from scoring.tasks import addition, countdown, minicode

TASKS: dict[str, ModuleType] = {"addition": addition, "countdown": countdown, "minicode": minicode}

# The seeds of the tasks' data pools, one home for every user: the held-out test split (scoring.benchmarks.tasks, the
# premise regime's held-out split at its own difficulty), the supervised warm-up pool (the demos draw it with this
# seed; the trainer's own warm-up with the run's seed + WARMUP_SEED, so it is not the RL prompt stream) and the demos'
# RL prompt pool. Far apart, so no two pools share a stream; changing one changes every problem id and result file
# written with it.
HELDOUT_SEED = 10_000
WARMUP_SEED = 7919
TRAIN_SEED = 1


def get_task(name: str) -> ModuleType:
    """The task module called ``name``; a ValueError lists the choices for an unknown name."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; choose one of: {', '.join(sorted(TASKS))}") from None

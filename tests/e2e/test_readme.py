"""README.md's Train, Evaluate and Analyse commands run as written, in order, in a fresh working folder.

The fenced ``bash`` blocks under "## Train", "## Evaluate" and "## Analyse" are read from README.md (continuation
lines joined, comments dropped), and each ``.venv/bin/python -m ...`` and ``.venv/bin/tsanalysis ...`` command runs
in that order in a temporary folder laid out like a fresh clone (the repository's entries linked in, no runs/,
results/ or data/), with toy sizes appended (``TOY``: later options win). The RL step count and checkpoint interval
stay tiny.yaml's, so the checkpoints written are the ones the README names; the warm-up is shortened, and its
folder, named after its step count, is renamed in the commands to the toy one (``toy_warmup``). Each command must
exit 0; every runs/, results/ or data/ path it reads must exist when it starts (written by an earlier command); and
what it writes must be where the README says. An edit of README.md or trainer/configs/tiny.yaml after which the
commands no longer chain (a checkpoint the training does not write, a benchmark or flag that is gone, a second
training refused) fails here.

About a minute of CPU (two 100-step trainings of a few rows each take most of it); slow by its folder (tests/e2e/,
tests/conftest.py).

Not run: the ``torchrun ... qwen25math7b_*`` training and the ``Qwen/...`` evaluation: they need GPUs and a 7B model
from the Hugging Face hub, neither of which the suite has.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
SECTIONS = ("## Train", "## Evaluate", "## Analyse")
OUTPUT_ROOTS = ("runs", "results", "data")   # what the commands write; not linked into the working folder
SKIP = ("torchrun", "Qwen/")                 # GPUs and the hub (module docstring)

# appended to each command (argparse and key=value overrides: the last value wins)
TOY = {
    "trainer.train": ["sft_steps=20", "prompts_per_step=2", "samples_per_prompt=2", "progress=false"],
    "eval.run": ["--n", "2", "--limit", "4", "--no-progress"],
    "relay": ["--n", "2", "--limit", "4"],
}


def readme_commands() -> list[list[str]]:
    """The runnable commands of the three sections' bash blocks, in order, as argument lists."""
    text = (REPO / "README.md").read_text()
    commands = []
    for section in SECTIONS:
        body = text.split(f"\n{section}\n", 1)[1].split("\n## ", 1)[0]
        for block in re.findall(r"```bash\n(.*?)```", body, re.S):
            for line in block.replace("\\\n", " ").splitlines():
                args = shlex.split(line, comments=True)
                if args and not any(s in line for s in SKIP):
                    assert args[0] in (".venv/bin/python", ".venv/bin/tsanalysis"), f"unexpected command: {line}"
                    commands.append(args)
    return commands


def toy_warmup(args: list[str]) -> list[str]:
    """The warm-up's folder is named after its step count (trainer.warmup.sft_cache_dir): the one tiny.yaml's run
    writes becomes the toy run's."""
    from trainer.config import load_config
    from trainer.warmup import sft_cache_dir

    preset = str(REPO / "trainer/configs/tiny.yaml")
    full, toy = (str(sft_cache_dir(load_config(preset, over))) for over in ([], TOY["trainer.train"]))
    return [a.replace(full, toy) for a in args]


def flag(args: list[str], name: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == name]


def kind(args: list[str]) -> str:
    """trainer.train, eval.run, ... for python -m; the subcommand (positions, relay) for tsanalysis."""
    return args[2] if args[0].endswith("python") else args[1]


def outputs(args: list[str]) -> list[str]:
    """Where the README says a command writes (relative to the working folder)."""
    k = kind(args)
    if k == "trainer.train":
        over = dict(a.split("=", 1) for a in args if "=" in a and not a.startswith("-"))
        preset = yaml.safe_load((REPO / flag(args, "--config")[0]).read_text())
        return [f"runs/{over.get('run_name', preset['run_name'])}/metrics.jsonl"]
    if k == "eval.run":   # the README names each model's results folder with --name
        names = flag(args, "--name")
        assert names and len(names) == len(flag(args, "--model")), f"give each --model a --name: {' '.join(args)}"
        return [f"results/eval/{n}/{b}.jsonl" for n in names for b in flag(args, "--benchmarks")[0].split(",")]
    if k == "eval.leaderboard":
        return [f"{args[3]}/leaderboard.md"]
    if k == "scoring.tasks.make":
        return flag(args, "--out")
    if k == "positions":
        return [f"results/analysis/{Path(args[2]).name}/positions"]
    if k == "relay":
        return [f"results/analysis/{Path(flag(args, '--final')[0]).parts[1]}/relay"]
    if k == "figures.make_all":
        return [f"{args[3]}/figures"]
    raise AssertionError(f"test_readme does not know where {' '.join(args[:4])} writes: add it to outputs()")


def test_readme_commands_chain(tmp_path):
    work = tmp_path / "clone"
    work.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in OUTPUT_ROOTS:
            (work / entry.name).symlink_to(entry)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}

    commands = readme_commands()
    assert {"trainer.train", "eval.run", "positions"} <= {kind(c) for c in commands}, "a section was not read"
    for line in commands:
        shown, args = " ".join(line), toy_warmup(line)
        reads = [a for a in args if a.split("/")[0] in OUTPUT_ROOTS and a not in outputs(args)]
        missing = [a for a in reads if not (work / a).exists()]
        assert not missing, f"{shown}\nreads {missing}, which the commands before it did not write"
        proc = subprocess.run(args + TOY.get(kind(args), []), cwd=work, env=env, capture_output=True, text=True,
                              timeout=900)
        assert proc.returncode == 0, f"{shown}\nexit {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        for out in outputs(args):
            assert (work / out).exists(), f"{shown}\nwrote no {out}"
        if kind(args) == "figures.make_all":
            assert list((work / outputs(args)[0]).glob("*.png")), f"{shown}\ndrew no PNG"

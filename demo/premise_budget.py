"""What the premise regime (``demo.premise``) runs, at which size: the budgets, the methods table's rows and the files
of its output folder (the seeds of its data are ``scoring.tasks``': ``HELDOUT_SEED``, ``WARMUP_SEED``,
``TRAIN_SEED``)."""

from __future__ import annotations

from dataclasses import dataclass

from demo.common import DemoError, RunSpec, seeded

MARKER = "premise.json"    # the budget the output folder was made with (guards --fresh and mixed budgets)
TIMINGS = "timings.json"   # per training run: wall and CPU seconds, torch threads, load average
STAGES = "stages.json"     # per stage: wall and CPU seconds summed over every invocation
EXTENSION = "extension.json"   # --extend-to: which runs were continued past the budget, to which step


@dataclass(frozen=True)
class PremiseBudget:
    """Sizes of one premise regime (every RL run gets the same steps, batch, budget, lr and temperature)."""

    name: str
    # task: countdown with exactly `numbers` numbers in [1, max_number], targets in [min_target, max_target]
    numbers: int = 3
    max_number: int = 10
    min_target: int = 1
    max_target: int = 30
    search: int = 0                # > 0: solver traces explore and backtrack (scoring.tasks.countdown's search)
    # warm-up
    model_size: str = "1m"
    warmup_pool: int = 20000
    warmup_steps: int = 400        # supervised steps at most (batch 64, cosine)
    warmup_lr: float = 3e-3
    warmup_stop_loss: float = 0.0  # > 0: stop once the mean loss of the last 20 steps is at or below it
    # RL
    train_pool: int = 4000
    total_steps: int = 50
    prompts_per_step: int = 32
    samples_per_prompt: int = 8
    max_response_tokens: int = 40
    lr: float = 1e-4
    temperature: float = 1.0       # the trainer's sampling temperature (evaluation is always at 1.0)
    early_step: int = 10           # the on-policy checkpoint (1-based step count) used as "early"
    seed_interval: int = 8         # T of the Thinking Seeds runs
    # evaluation and relay
    heldout: int = 200             # held-out problems
    eval_n: int = 64               # samples per problem (pass@k for k <= eval_n)
    relay_n: int = 64
    seeds: int = 3                 # training seeds per method of the table
    curve_every: int = 10          # every run also keeps and scores its checkpoint each this many steps (the
                                   # pass@1 / pass@k frontier, matched pass@1 and compute); 0: the final one only
    # the paper's rows, LUFFY and M2PO, and two restart distributions (issue #25): the paper's §7 adaptive cut and
    # PrefixRL-like restarts of all-wrong prompts from past correct responses
    methods: str = "onpolicy,seeds_ratio,seeds_entropy,seeds_state,luffy,m2po,restart_adaptive,restart_pool"

    @property
    def task(self) -> str:
        return "countdown"

    @property
    def difficulty(self) -> dict:
        return {"min_numbers": self.numbers, "max_numbers": self.numbers, "min_number": 1,
                "max_number": self.max_number, "min_target": self.min_target, "max_target": self.max_target,
                "search": self.search}


# fields added to the budget after folders were written, with the value such a folder's marker stands for
ADDED_FIELDS = {"search": 0}

PREMISE = PremiseBudget(name="premise")
# `python -m demo`'s main job (issue #27): the premise regime with ONE training seed and three of its eight methods
# (on-policy, Thinking Seeds ratio state+action, LUFFY), at the same task, warm-up, RL budget, held-out split and n.
# Its curves, crossover, relay and per-problem intervals are the premise's; what it gives up is the spread over
# training seeds and three rows (module docstring of demo.reduced). Measured at commit c8eb9ff on 2 idle AMD EPYC
# cores (2 torch threads, the warm-up at 1): warm-up + its scoring 317 s, on-policy + early/final scoring 162 s,
# relay 93 s, the seeded run 144 s of training; the entropy-rule and M2PO rows were left out to stay near ten
# minutes (`python -m demo.premise --budget reduced --methods onpolicy,seeds_ratio,seeds_entropy,luffy,m2po` has them).
REDUCED = PremiseBudget(name="reduced", seeds=1, methods="onpolicy,seeds_ratio,luffy", curve_every=0)
# the tests' size of both (seconds): every stage and output of the reduced regime, each method a few steps
TOY = PremiseBudget(name="toy", warmup_pool=500, warmup_steps=20, train_pool=200, total_steps=3,
                    prompts_per_step=4, samples_per_prompt=4, early_step=1, seed_interval=2, heldout=12,
                    eval_n=8, relay_n=8, seeds=1, methods="onpolicy,seeds_ratio,seeds_entropy,luffy", curve_every=1)
BUDGETS = {"premise": PREMISE, "reduced": REDUCED, "toy": TOY}


def _methods() -> dict[str, RunSpec]:
    """The table's rows: on-policy, Thinking Seeds (ratio / entropy rule, state+action; ratio, state), LUFFY, M2PO;
    opt-in: the 2025 exploration baselines and the restart distributions."""
    def T(b):
        return b.seed_interval
    return {
        "onpolicy": RunSpec("onpolicy", "mini_onpolicy", "On-policy DAPO"),
        "seeds_ratio": RunSpec("seeds_ratio", "mini_seeds_ratio", "Thinking Seeds, ratio 0.5 (state+action)",
                               seeded("ratio", 0.5, "state+action", T)),
        "seeds_entropy": RunSpec("seeds_entropy", "mini_seeds_entropy", "Thinking Seeds, entropy rule (state+action)",
                                 seeded("entropy", 0.5, "state+action", T)),
        "seeds_state": RunSpec("seeds_state", "mini_seeds_state", "Thinking Seeds, ratio 0.5 (state)",
                               seeded("ratio", 0.5, "state", T)),
        "luffy": RunSpec("luffy", "mini_luffy", "LUFFY (1 solver trace per group)"),
        "m2po": RunSpec("m2po", "mini_m2po", "M2PO (rollouts 4 steps stale)"),
        # the 2025 exploration baselines (issue #25; trainer/configs/mini_*.yaml cite their papers): not in the default
        # methods of any budget; `python -m demo.premise --methods onpolicy,clip_cov,...` runs them
        "clip_cov": RunSpec("clip_cov", "mini_clip_cov", "Clip-Cov (2505.22617; 4 updates per batch)"),
        "kl_cov": RunSpec("kl_cov", "mini_kl_cov", "KL-Cov (2505.22617; 4 updates per batch)"),
        "passk": RunSpec("passk", "mini_passk", "pass@k advantages, k 4 (2508.10751)"),
        "w_reinforce": RunSpec("w_reinforce", "mini_w_reinforce", "W-REINFORCE, lambda 0.1 (2506.01347)"),
        "high_entropy": RunSpec("high_entropy", "mini_high_entropy", "high-entropy tokens only, top 20 % (2506.01939)"),
        # restart distributions (issue #25 item 3; trainer/algos/restarts.py): also opt-in rows
        "restart_fr3e": RunSpec("restart_fr3e", "mini_restart_fr3e",
                                "restart from this step's responses, entropy cut (FR3E-like, 2507.07017)"),
        "restart_pool": RunSpec("restart_pool", "mini_restart_pool",
                                "all-wrong prompts restart from past correct responses (PrefixRL-like, 2601.18795)",
                                lambda b: {"seed_refresh_interval": T(b)}),
        "restart_external": RunSpec("restart_external", "mini_restart_external",
                                    "all-wrong prompts restart from half the solver trace (Prefix-RFT-like, 2507.01679)"),
        "restart_adaptive": RunSpec("restart_adaptive", "mini_restart_adaptive",
                                    "Thinking Seeds, cut chosen by estimated success (paper §7)",
                                    lambda b: {"seed_refresh_interval": T(b)}),
        "restart_all_wrong": RunSpec("restart_all_wrong", "mini_restart_all_wrong",
                                     "Thinking Seeds, only all-wrong prompts restart",
                                     lambda b: {"seed_refresh_interval": T(b)}),
        # beyond the paper (issue #41 item 6, docs/beyond.md): opt-in rows. LoRA at 10x the full run's lr (the
        # usual LoRA-to-full ratio, "LoRA Without Regret"), rank 8 on the seven projections; seeds from the last
        # three refresh policies (t, t - T, t - 2T), uniform
        "onpolicy_lora": RunSpec("onpolicy_lora", "mini_onpolicy", "On-policy DAPO, LoRA rank 8 (lr 10x)",
                                 lambda b: {"lora_rank": 8, "lr": 10 * b.lr}),
        "seeds_mixture": RunSpec("seeds_mixture", "mini_seeds_ratio",
                                 "Thinking Seeds, ratio 0.5, seeds from the last 3 refresh policies",
                                 lambda b: {**seeded("ratio", 0.5, "state+action", T)(b), "seed_source": "mixture",
                                            "seed_mixture_size": 3}),
    }


METHODS = _methods()


def eval_name(method: str, seed: int) -> str:
    return f"{method}-seed{seed}"


def curve_steps(b: PremiseBudget) -> list[int]:
    """The intermediate checkpoints every run keeps and scores (1-based step counts, the final one excluded)."""
    return list(range(b.curve_every, b.total_steps, b.curve_every)) if b.curve_every > 0 else []


def extension_steps(b: PremiseBudget, extend_to: int) -> list[int]:
    """The checkpoints ``--extend-to`` scores past the budget: every ``curve_every`` steps up to ``extend_to``."""
    return list(range(b.total_steps + b.curve_every, extend_to + 1, b.curve_every)) if b.curve_every > 0 else []


def long_name(run: str) -> str:
    """The folder of a run's continued copy (``--extend-to``) beside the run itself."""
    return f"{run}-long"


def curve_name(method: str, seed: int, step: int) -> str:
    """The eval name of a run's checkpoint after ``step`` steps (the final one is ``eval_name``)."""
    return f"{eval_name(method, seed)}-step{step:03d}"


def method_list(b: PremiseBudget) -> list[str]:
    names = [m.strip() for m in b.methods.split(",") if m.strip()]
    bad = [m for m in names if m not in METHODS]
    if bad or "onpolicy" not in names:
        raise DemoError(f"methods {bad or names}: choose from {sorted(METHODS)}, including onpolicy")
    return names

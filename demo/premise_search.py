"""The grid searched for the premise regime (issue #16): ``python -m demo.premise_search [--points a,b]``.

Each point is a (task difficulty, warm-up, RL) setting: a supervised warm-up, then ONE on-policy DAPO run whose
checkpoints at a few steps are scored on the held-out split with n samples per problem, so one run gives the
whole trajectory (pass@1 and pass@large-k against RL steps). A point shows narrowing when a checkpoint's
pass@1 is above the warm-up's while its pass@k at the largest k is at or below it. Warm-ups, runs and graded
problems are cached under ``--out`` (default ``runs/premise-search``) and shared between points with the same
settings, so the search resumes; ``results.json`` there holds every point's numbers, which ``docs/premise.md``
reports.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from contracts.files import atomic_write_json, atomic_write_text
from contracts.passk import k_grid
from demo.common import train_run
from demo.premise import checkpoint, evaluate, make_data, read_eval, rl_config, warmup
from demo.premise_budget import PREMISE, PremiseBudget
from demo.premise_page import GRID_END, GRID_START
from demo.premise_stats import distinct_correct, per_problem

# name -> (budget overrides, RL checkpoints scored); the order is the order the search ran them in
POINTS: dict[str, tuple[dict, tuple[int, ...]]] = {
    "A": ({"lr": 1e-4, "total_steps": 100}, (25, 50, 100)),
    "B": ({"lr": 2e-4, "total_steps": 50}, (10, 25, 50)),
    "C": ({"lr": 1e-4, "total_steps": 50, "temperature": 0.7}, (10, 25, 50)),
    "D": ({"lr": 1e-4, "total_steps": 50, "warmup_steps": 200}, (10, 25, 50)),
    "E": ({"lr": 1e-4, "total_steps": 50, "max_number": 20, "min_target": 10, "max_target": 100}, (10, 25, 50)),
}


def _key(d: dict) -> str:
    return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]


def run_point(name: str, over: dict, steps: tuple[int, ...], *, out: Path, log=print) -> dict:
    b: PremiseBudget = replace(PREMISE, name=name, **over)
    t0 = time.perf_counter()
    dkey = _key({k: getattr(b, k) for k in ("numbers", "max_number", "min_target", "max_target", "heldout",
                                            "warmup_pool", "train_pool")})
    data = make_data(out / "data" / dkey, b, log=log)
    wkey = _key({"d": dkey, **{k: getattr(b, k) for k in ("model_size", "warmup_steps", "warmup_lr",
                                                          "warmup_stop_loss")}})
    warm, wsum = warmup(out / "warmup" / wkey, data["warmup"], b, log=log)
    t_warm = time.perf_counter() - t0
    rkey = _key({"w": wkey, **{k: getattr(b, k) for k in ("total_steps", "prompts_per_step", "samples_per_prompt",
                                                          "max_response_tokens", "lr", "temperature")}})
    b = replace(b, total_steps=max(steps))
    cfg = rl_config("onpolicy", b, out=out, seed=0, model=warm, train_file=data["train"], save_steps=steps,
                    name=f"onpolicy-{rkey}")
    t1 = time.perf_counter()
    train_run(cfg, log=log)
    t_train = time.perf_counter() - t1
    models = [(f"warmup-{wkey}", warm)] + [(f"onpolicy-{rkey}-s{s}", checkpoint(cfg, s)) for s in steps]
    t2 = time.perf_counter()
    evaluate(models, b, heldout=data["heldout"], root=out / "eval", n=b.eval_n, log=log)
    t_eval = time.perf_counter() - t2
    ks = k_grid(b.eval_n)
    res = {"name": name, "over": over, "steps": list(steps), "warmup": wsum, "models": {},
           "wall_s": {"warmup_and_data": t_warm, "train": t_train, "eval": t_eval}}
    for label, _ in models:
        rows = read_eval(out / "eval", label)
        n, c, _, m = per_problem(rows, ks)
        res["models"][label.split("-")[0] if label.startswith("warmup") else "step" + label.rsplit("-s", 1)[1]] = {
            "pass": {int(k): float(m[:, j].mean()) for j, k in enumerate(ks)},
            "distinct_correct": float(distinct_correct(rows).mean()),
            "solved_frac": float((c > 0).mean())}
    return res


def _describe(over: dict) -> str:
    b = replace(PREMISE, **over)
    return (f"{b.numbers} numbers 1..{b.max_number}, target {b.min_target}..{b.max_target}; warm-up "
            f"{b.warmup_steps} steps; RL lr {b.lr:g}, temperature {b.temperature:g}")


def table(results: list[dict]) -> str:
    """The grid as a markdown table: per point and checkpoint pass@1/8/64, distinct correct solutions, and whether
    that checkpoint shows narrowing (pass@1 above the warm-up's, pass@64 at or below it)."""
    lines = ["| point | setting | model | pass@1 % | pass@8 % | pass@64 % | distinct correct / problem | "
             "narrowing | wall s (warm-up / RL / eval) |", "|---|---|---|---:|---:|---:|---:|---|---|"]
    for r in results:
        w = r["models"]["warmup"]["pass"]
        for m, v in r["models"].items():
            p = {int(k): x for k, x in v["pass"].items()}
            K = max(p)
            wk = {int(k): x for k, x in w.items()}
            narrow = "" if m == "warmup" else ("yes" if p[1] > wk[1] and p[K] <= wk[K] else "no")
            ws = r["wall_s"]
            cost = (f"{ws['warmup_and_data']:.0f} / {ws['train']:.0f} / {ws['eval']:.0f}" if m == "warmup" else "")
            lines.append(f"| {r['name']} | {_describe(r['over']) if m == 'warmup' else ''} | "
                         f"{m.replace('step', 'RL step ')} | {100 * p[1]:.1f} | {100 * p[8]:.1f} | {100 * p[K]:.1f} | "
                         f"{v['distinct_correct']:.2f} | {narrow} | {cost} |")
    return "\n".join(lines)


def write_grid(doc: Path, results: list[dict]) -> None:
    """Replace the grid block of ``doc`` (between demo.premise_page's GRID_START / GRID_END markers) with the table."""
    text = doc.read_text() if doc.is_file() else ""
    block = (f"{GRID_START}\nEach point: one warm-up and ONE on-policy run (seed 0, {PREMISE.prompts_per_step} prompts "
             f"x {PREMISE.samples_per_prompt} samples per step, <= {PREMISE.max_response_tokens} tokens), checkpoints "
             f"scored on {PREMISE.heldout} held-out problems of the point's difficulty with n = {PREMISE.eval_n} "
             "(`python -m demo.premise_search`; cached in `runs/premise-search/results.json`). Wall seconds with "
             "one torch thread while other jobs shared the two cores (0: the warm-up was cached from an earlier "
             "point). \"narrowing\": pass@1 above the warm-up's and pass@64 at or below it.\n\n" + table(results) + f"\n{GRID_END}")
    if GRID_START in text and GRID_END in text:
        text = text[:text.index(GRID_START)] + block + text[text.index(GRID_END) + len(GRID_END):]
    else:
        text = text.rstrip("\n") + "\n\n## Grid searched\n\n" + block + "\n"
    atomic_write_text(doc, text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m demo.premise_search", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/premise-search")
    p.add_argument("--points", default=None, help="comma-separated point names (default: all)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: the cores were shared)")
    p.add_argument("--write-grid", action="store_true", help="only write the grid table into --doc from results.json")
    p.add_argument("--doc", default="docs/premise.md")
    args = p.parse_args(argv)
    out = Path(args.out)
    resf = out / "results.json"
    if args.write_grid:
        results = json.loads(resf.read_text())
        order = {n: i for i, n in enumerate(POINTS)}
        write_grid(Path(args.doc), sorted(results, key=lambda r: order.get(r["name"], len(order))))
        print(table(results))
        return 0
    torch.set_num_threads(args.threads)
    out.mkdir(parents=True, exist_ok=True)
    results = {r["name"]: r for r in (json.loads(resf.read_text()) if resf.is_file() else [])}
    names = args.points.split(",") if args.points else list(POINTS)
    for name in names:
        over, steps = POINTS[name]
        r = run_point(name, over, steps, out=out)
        results[name] = r
        atomic_write_json(resf, list(results.values()), indent=1, default=str)
        print(table([r]), flush=True)
    print(table(list(results.values())))
    return 0


if __name__ == "__main__":
    sys.exit(main())

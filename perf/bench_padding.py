"""What the update computes at the paper presets' shapes on 8 ranks: the padded forward (``policy.pack``, rows strided
across ranks, masked attention over the whole square) against the flat forward under FSDP (``inference.flat``:
whole groups per rank balanced by tokens, each distinct prompt once, causal prompt attention).

A count, not a timing: every number follows from the micro-batch split (``inference.batching.micro_batches``, the
trainer's own) of one synthetic step. The step: ``prompts_per_step`` prompts x ``samples_per_prompt`` responses;
prompt lengths uniform in [64, max_prompt_tokens / 2]; response lengths drawn from a lognormal with its median at
30 % of ``max_response_tokens``, capped there (the cap holds ~10 % of rows, as long-thinking models truncate).
Shares are of the tokens the projections, MLP and LM head run on (nearly all of a forward's FLOPs outside attention):

- padded share: tokens past a row's own length in its micro-batch grid (padded layout only);
- repeated-prompt share: prompt tokens computed again for a group's second and later samples;
- attention: query-key products computed, against what causal attention over each row's own tokens needs (the
  padded forward's masked call computes the whole square; the flat forward's causal blocks of rows of similar
  length, half of each block's square).
"""

from __future__ import annotations

import math
import random

from perf.common import BenchResult, Check, Context
from inference.batching import micro_batches
from inference.flat import build_layout

PRESET_NAMES = ("qwen25math7b_seeds_entropy", "qwen3_4b_code_seeds_state")


def preset_shapes(name: str) -> tuple[int, int, int, int, int, int]:
    """(max_prompt_tokens, max_response_tokens, prompts_per_step, samples_per_prompt, micro_batch_size,
    micro_batch_tokens) of a preset in trainer/configs/."""
    from trainer.config import load_config
    from pathlib import Path
    cfg = load_config(str(Path(__file__).resolve().parents[1] / "trainer" / "configs" / f"{name}.yaml"), [])
    return (cfg.max_prompt_tokens, cfg.max_response_tokens, cfg.prompts_per_step, cfg.samples_per_prompt,
            cfg.micro_batch_size, cfg.micro_batch_tokens)


PRESETS = {name: preset_shapes(name) for name in PRESET_NAMES}
WORLD = 8


def synthetic_step(max_prompt: int, max_response: int, prompts: int, G: int, seed: int = 0):
    rng = random.Random(seed)
    shapes, keys = [], []
    for k in range(prompts):
        p = rng.randint(64, max_prompt // 2)
        for _ in range(G):
            r = min(max_response, max(1, int(rng.lognormvariate(math.log(0.3 * max_response), 0.9))))
            shapes.append((p, r))
            keys.append(k)
    return shapes, keys


def count(shapes, keys, *, rows: int, tokens: int, flat: bool) -> dict:
    """GEMM tokens, useful tokens, attention products and the busiest rank's share, summed over the ranks."""
    gemm = attn = 0
    per_rank = []
    for rank in range(WORLD):
        split, _ = micro_batches(shapes, rows=rows, tokens=tokens, rank=rank, world_size=WORLD,
                                 prompt_keys=keys if flat else None)
        mine = 0
        for mb in split:
            if flat:   # the trainer's own layout: causal blocks of whole rows (the fused kernel skips the upper half)
                lay = build_layout([[keys[i] + 1] * shapes[i][0] for i in mb], [[7] * shapes[i][1] for i in mb],
                                   device="cpu")
                t = int(lay.ids.numel())
                a = sum(blk.shape[0] * blk.shape[1] * blk.shape[1] // 2 for blk in lay.blocks)
            else:
                L = max(shapes[i][0] for i in mb) + max(shapes[i][1] for i in mb)
                t = len(mb) * L
                a = len(mb) * L * L   # a masked call: the whole square, padding included
            mine += t
            gemm += t
            attn += a
        per_rank.append(mine)
    useful = sum(p + r for p, r in shapes)
    distinct = sum({k: p for (p, _), k in zip(shapes, keys)}.values()) + sum(r for _, r in shapes)
    needed_attn = sum((p + r) * (p + r) // 2 for p, r in shapes)
    return {"gemm_tokens": gemm, "row_tokens": useful, "distinct_tokens": distinct,
            "padded_share": max(0.0, (gemm - useful) / gemm) if not flat else 0.0,
            "repeated_prompt_share": (useful - distinct) / gemm if not flat else
            max(0.0, (gemm - distinct) / gemm),
            "attention_products": attn, "attention_needed": needed_attn,
            "busiest_rank_over_mean": max(per_rank) / (sum(per_rank) / WORLD)}


def run(ctx: Context) -> BenchResult:
    res = BenchResult("padding", "tokens the update computes at the paper presets' shapes, 8 ranks: padded model "
                                 "forward vs the flat forward under FSDP (a count)")
    rows_out = []
    for name, (mp, mr, n, G, mbs, mbt) in PRESETS.items():
        shapes, keys = synthetic_step(mp, mr, n, G)
        before = count(shapes, keys, rows=mbs, tokens=mbt, flat=False)
        after = count(shapes, keys, rows=mbs, tokens=mbt, flat=True)
        for side, c in (("padded", before), ("flat", after)):
            rows_out.append({"preset": name, "forward": side, "GEMM tokens (M)": round(c["gemm_tokens"] / 1e6, 2),
                             "padded share": round(c["padded_share"], 3),
                             "repeated-prompt share": round(c["repeated_prompt_share"], 3),
                             "attention products / causal need": round(c["attention_products"] / c["attention_needed"], 2),
                             "busiest rank / mean": round(c["busiest_rank_over_mean"], 2)})
        res.checks.append(Check(f"{name}: flat / padded GEMM tokens", after["gemm_tokens"] / before["gemm_tokens"],
                                "<=", 1.0, "flat forward's tokens over the padded forward's: never more"))
        res.checks.append(Check(f"{name}: flat / padded attention products",
                                after["attention_products"] / before["attention_products"], "<=", 0.6,
                                "query-key products, flat over padded"))
        res.info[name] = {"padded": before, "flat": after}
    res.tables["tokens"] = rows_out
    res.params = {"world_size": WORLD, "presets": {k: dict(zip(("max_prompt", "max_response", "prompts", "G",
                                                                "micro_batch_size", "micro_batch_tokens"), v))
                                                   for k, v in PRESETS.items()}}
    return res

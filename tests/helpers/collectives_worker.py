"""torchrun worker for tests/trainer/test_collectives.py: the trainer's gathers on 2 ranks (gloo).

    torchrun --nproc_per_node 2 tests/helpers/collectives_worker.py OUT_DIR [patient]

Each rank writes ``OUT_DIR/rank<R>.json``: what each gather gave it, and the same rows through the object gather
(``all_gather_objects``) the tensor gathers replaced. ``patient``: the process group's collectives time out after
``PG_TIMEOUT_S`` and rank 1 "generates" for ``LONG_S`` > that; each rank writes what the wait after it met on the
patient group (``wait_for_generation``) and on the process group.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path


def _nan_safe(x):
    return None if isinstance(x, float) and math.isnan(x) else x


def main(out: Path) -> int:
    import torch

    from inference.protocol import Completion
    from trainer.fsdp import all_gather_objects, all_gather_rows, gather_objects_to_main, init_distributed
    from trainer.metrics import gather_records
    from trainer.rollout import gather_completions

    torch.set_num_threads(1)
    d = init_distributed()
    # rank 0 holds three rows (one empty, one with NaN log-probs, an id past 2^16), rank 1 one row without log-probs;
    # the engines' numbers are float32 values (0.1 is not one: float32's nearest)
    f32 = [float(x) for x in torch.tensor([-0.1, -1.3, -2.7, 0.1, 0.2, 0.3])]
    mine = {0: {0: Completion([5, 151_000, 7], "stop", f32[:3], f32[3:]),
                2: Completion([], "length", [], []),
                3: Completion([9, 9], "length", [math.nan, -0.25], None)},
            1: {1: Completion([4, 3, 2, 1], "length", None, None)}}[d.rank]
    got = gather_completions(mine, d)
    ref = {}
    for part in all_gather_objects(mine, d):
        ref.update(part)
    rows = all_gather_rows({i: c.token_ids for i, c in mine.items()}, d, dtype=torch.int32)
    records = gather_records({10 + d.rank: f"record of rank {d.rank}"}, d)
    to_main = gather_objects_to_main(d.rank * 10, d)
    res = {"completions": {i: [c.token_ids, c.finish_reason, c.logprobs and [_nan_safe(x) for x in c.logprobs],
                               c.entropies] for i, c in sorted(got.items())},
           "reference": {i: [c.token_ids, c.finish_reason, c.logprobs and [_nan_safe(x) for x in c.logprobs],
                             c.entropies] for i, c in sorted(ref.items())},
           "row_dtypes": sorted({str(v.dtype) for v in rows.values()}),
           "records": records, "to_main": to_main}
    (out / f"rank{d.rank}.json").write_text(json.dumps(res))
    torch.distributed.destroy_process_group()
    return 0


PG_TIMEOUT_S, LONG_S = 3, 6


def patient(out: Path) -> int:
    import datetime
    import os
    import time

    import torch
    import torch.distributed as dist

    import trainer.fsdp as fsdp

    fsdp.COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=PG_TIMEOUT_S)
    os.environ[fsdp.GENERATION_TIMEOUT_ENV] = "1"   # minutes
    d = fsdp.init_distributed()
    cpu = torch.device("cpu")
    res = {"timeouts_s": [g._get_backend(cpu).options._timeout.total_seconds()
                          for g in (dist.group.WORLD, fsdp.patient_group(d))]}
    t0 = time.perf_counter()
    if d.rank == 1:
        time.sleep(LONG_S)   # a generation longer than the process group's timeout
    fsdp.wait_for_generation(d)
    res["after_patient_wait"] = fsdp.all_gather_objects(d.rank, d)   # the gather that follows, on the process group
    res["patient_wait_s"] = time.perf_counter() - t0
    (out / f"rank{d.rank}.json").write_text(json.dumps(res))
    if d.rank == 1:
        time.sleep(LONG_S)
    try:   # the same wait in a collective of the process group: the job fails
        fsdp.barrier(d)
        res["process_group_wait"] = None
    except Exception as exc:
        res["process_group_wait"] = type(exc).__name__
    (out / f"rank{d.rank}.json").write_text(json.dumps(res))
    sys.stdout.flush()
    os._exit(0)   # the process group is broken now: no teardown


if __name__ == "__main__":
    sys.exit(patient(Path(sys.argv[1])) if sys.argv[2:] == ["patient"] else main(Path(sys.argv[1])))

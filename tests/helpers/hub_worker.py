"""torchrun worker for tests/e2e/test_hub_ids.py: the trainer's per-node hub download under a short collective timeout.

    torchrun --nproc_per_node 2 tests/helpers/hub_worker.py SPEC_JSON

SPEC_JSON: ``{"mode": "train" | "collective", "collective_timeout_s": S, "download_delay_s": D, "calls_dir": DIR,
"overrides": ["key=value", ...]}``. Both modes set the process group's collective timeout to S seconds
(``trainer.fsdp.COLLECTIVE_TIMEOUT``) and make a download (``inference.hub.resolve_model`` asked to fetch) take D
seconds longer, D > S: the regime where a download that other ranks wait for inside a collective kills the job.

- ``train``: ``trainer.train.main(overrides)``, the command line's own entry point; each rank that asked for a
  download writes ``DIR/download_rank<R>`` (the test checks it was local rank 0 only). Exits with main's status.
- ``collective``: the pattern the trainer must not use: local rank 0 downloads while the others wait in a
  collective of the process group. Each rank writes ``DIR/collective_rank<R>.json`` with what it met.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path


def main(spec: dict) -> int:
    import torch

    import inference.hub
    import trainer.fsdp
    import trainer.train   # every import before the process group starts: ranks reach it together
    import trainer.warmup

    torch.set_num_threads(1)
    rank = os.environ["RANK"]
    calls = Path(spec["calls_dir"])
    trainer.fsdp.COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=spec["collective_timeout_s"])
    resolve = inference.hub.resolve_model

    def slow_resolve(name, *, what="model", download=True):
        if download and not os.path.exists(name):   # a hub id that may be fetched: slow
            (calls / f"download_rank{rank}").write_text(name)
            time.sleep(spec["download_delay_s"])
        return resolve(name, what=what, download=download)

    inference.hub.resolve_model = slow_resolve
    trainer.warmup.resolve_model = slow_resolve   # where the trainer's hub_snapshot looks it up
    if spec["mode"] == "train":
        return trainer.train.main(spec["overrides"])
    d = trainer.fsdp.init_distributed()
    t0 = time.perf_counter()
    try:
        if d.local_rank == 0:
            slow_resolve(spec["overrides"][0])
        trainer.fsdp.all_gather_objects(None, d)
        met = None
    except Exception as exc:   # the timeout (or the peer that left after its own)
        met = f"{type(exc).__name__}: {exc}"
    (calls / f"collective_rank{rank}.json").write_text(json.dumps({"error": met, "s": time.perf_counter() - t0}))
    sys.stdout.flush()
    os._exit(0)   # a timed-out group cannot be shut down cleanly


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))

"""EvalPlus's harness inside the jail (``evalplus``): its unsafe_execute around the candidate, or its trusted_exec
for the canonical solution. Standard library only (EvalPlus's own helpers come from the installed package's
evalplus/eval/utils.py, which the runner loads from its file into ``records.LOADED``); imported by the runner as a
top-level module (see ``runner.py``); ``records.py`` describes what a harness writes.
"""

import contextlib
import time
from copy import deepcopy

from protocol import decode_tagged, encode_tagged, trust_collections
from records import LOADED, failure

trust_collections()   # Counter, OrderedDict, defaultdict cross with their type: known by identity, before any program


def evalplus(spec, payload, out):
    """EvalPlus: ``trusted`` = its trusted_exec (the canonical solution: deepcopy of each input, timed, no guard);
    else its unsafe_execute around the candidate (reliability_guard, swallow_io, time_limit per input), stopping at
    the first exception like its fast_check; the comparison is EvalPlus's own, run by the grader on the values."""
    h = spec["harness"]
    inputs = decode_tagged(payload["inputs"])
    entry = spec["fn_name"]
    trusted = bool(payload.get("trusted"))
    if not trusted:
        u = LOADED["evalplus_utils"]
        u.reliability_guard(maximum_memory_bytes=h["max_memory_bytes"])
    g = {}
    try:
        with (contextlib.nullcontext() if trusted else u.swallow_io()):
            exec(spec["source"], g)
            fn = g[entry]
    except BaseException as e:
        out.put(failure(0, e, "load"))
        return
    if trusted:
        for i, inp in enumerate(inputs):
            inp = deepcopy(inp)
            try:
                t0 = time.time()
                value = fn(*inp)
                dt = time.time() - t0
            except BaseException as e:
                out.put(failure(i, e))
                return
            if payload.get("output_not_none"):
                value = value is not None
            if not out.put({"i": i, "s": "ok", "v": encode_tagged(value, True), "t": dt}):
                return
        return
    limits = payload["limits"]
    for i, inp in enumerate(inputs):
        try:
            with u.time_limit(limits[i]):
                with u.swallow_io():
                    value = fn(*inp)
            rec = {"i": i, "s": "ok", "v": encode_tagged(value, True)}
        except BaseException as e:
            rec = failure(i, e)
            if isinstance(e, u.TimeoutException):
                rec["s"] = "timeout"
        if not out.put(rec) or rec["s"] != "ok":
            return

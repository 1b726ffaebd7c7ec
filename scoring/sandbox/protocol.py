"""What both sides of the sandbox agree on: the grader (``scoring.sandbox.host``) and the trusted runner and its
harnesses inside the jail (``runner.py``, ``harness*.py``) import this one module.

Standard library only, and nothing at import time beyond it: the runner imports it as a top-level module from its
own folder (``python -I -S -B runner.py``: no site, no project package), the grader as ``scoring.sandbox.protocol``.

- ``MEMORY_EXIT``: the exit status of a case process whose program died of an uncaught MemoryError.
- ``HOST_TMP`` / ``jail_path``: where a host path appears inside the jail (the jail's /tmp is its own tmpfs).
- ``HARNESS_MODES``: the reference graders' harnesses the runner has (``run_harness``).
- The tagged values (``encode_tagged`` / ``decode_tagged``): Python data as JSON that keeps tuples, sets,
  frozensets, dicts with any keys, complex and bytes. The grader encodes EvalPlus's inputs (strict: an unknown type
  is an error), the harness decodes them and encodes what the program returned (``lenient=True``: subclasses of the
  JSON scalars as the scalar, numpy values with their dtype, anything else as its type name and repr), and the
  grader decodes that (``Opaque``, ``CallException``). No code is evaluated either way.
- ``jsonable``: a returned value as plain JSON data for LiveCodeBench's ``==`` (function mode, ``lcb_call``).
"""

MEMORY_EXIT = 213                 # exit status the case process uses for an uncaught MemoryError
HOST_TMP = "/.host-tmp"           # where host paths under /tmp (a checkout or venv there) appear in the jail
HARNESS_MODES = ("lcb_stdin", "lcb_call", "evalplus")
TEST_MODES = ("checks", "assert")   # the modes whose verdict needs the epilogue's completion token (epilogue.py)

__all__ = ["CallException", "HARNESS_MODES", "HOST_TMP", "MEMORY_EXIT", "TEST_MODES", "Opaque", "decode_tagged", "encode_tagged",
           "is_numpy", "jail_path", "jsonable"]


def jail_path(path):
    """Where a host path appears inside the jail: as itself, except under /tmp (the jail's /tmp is a fresh tmpfs),
    which moves to ``HOST_TMP`` (a checkout or venv under /tmp keeps its packages importable by programs)."""
    return HOST_TMP + path[4:] if path == "/tmp" or path.startswith("/tmp/") else path


def is_numpy(t):
    """Is ``t`` a numpy scalar or array type (told without importing numpy)?"""
    return getattr(t, "__module__", "") == "numpy" and hasattr(t, "dtype") and hasattr(t, "tolist")


# ---- tagged values ---------------------------------------------------------------------------------------------

def encode_tagged(x, lenient=False):
    """Python data -> the JSON-able tagged form ``decode_tagged`` reads back. Strict (the grader's inputs): a type
    outside the tagged ones is a TypeError. ``lenient`` (a program's returned values, in the jail): subclasses of
    bool/int/float/str become the plain value, numpy values keep their dtype, anything else is its repr."""
    t = type(x)
    if x is None or t is bool or t is int or t is float or t is str:
        return x
    if t is list:
        return [encode_tagged(v, lenient) for v in x]
    if t is tuple:
        return {"__tuple__": [encode_tagged(v, lenient) for v in x]}
    if t is set or t is frozenset:
        return {"__" + t.__name__ + "__": [encode_tagged(v, lenient) for v in x]}
    if t is dict:
        return {"__dict__": [[encode_tagged(k, lenient), encode_tagged(v, lenient)] for k, v in x.items()]}
    if t is complex:
        return {"__complex__": [x.real, x.imag]}
    if t is bytes:
        return {"__bytes__": x.hex()}
    if not lenient:
        raise TypeError(f"cannot send a {t.__name__} into the sandbox")
    for plain in (bool, int, float, str):
        if isinstance(x, plain):
            return plain(x)
    if is_numpy(t):   # numpy scalars and arrays keep their dtype: EvalPlus compares them as numpy values
        try:
            return {"__numpy__": [x.dtype.str, list(x.shape), encode_tagged(x.tolist(), True)]}
        except Exception:
            pass
    try:
        r = repr(x)[:200]
    except Exception:
        r = "?"
    return {"__repr__": [t.__name__, r]}


class Opaque:
    """A returned value of a type the sandbox does not carry across (decoded from ``{"__repr__": ...}``): equal only
    to an Opaque of the same type name and repr."""

    def __init__(self, type_name, text):
        self.type_name, self.text = type_name, text

    def __eq__(self, other):
        return isinstance(other, Opaque) and (self.type_name, self.text) == (other.type_name, other.text)

    def __hash__(self):
        return hash((self.type_name, self.text))

    def __repr__(self):
        return f"<{self.type_name} {self.text}>"


class CallException:
    """The exception a call raised in ``mode="calls"`` (never equal to a value)."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return f"<exception {self.text}>"


def decode_tagged(x):
    """Tagged data back into Python values: tuples, sets, frozensets, dicts with any keys, complex, bytes, numpy
    values (numpy is imported only for those); an unknown type becomes ``Opaque``, a raised exception
    ``CallException``. A malformed or unknown tag is a ValueError. No code is evaluated."""
    if isinstance(x, list):
        return [decode_tagged(v) for v in x]
    if not isinstance(x, dict):
        return x
    if len(x) != 1:
        raise ValueError(f"malformed tagged value with keys {sorted(x)[:5]}")
    (tag, v), = x.items()
    if tag == "__tuple__":
        return tuple(decode_tagged(e) for e in v)
    if tag == "__set__":
        return {decode_tagged(e) for e in v}
    if tag == "__frozenset__":
        return frozenset(decode_tagged(e) for e in v)
    if tag == "__dict__":
        return {decode_tagged(k): decode_tagged(e) for k, e in v}
    if tag == "__complex__":
        return complex(float(v[0]), float(v[1]))
    if tag == "__bytes__":
        return bytes.fromhex(v)
    if tag == "__numpy__":   # a numpy scalar or array: rebuilt with its dtype (optional: only such a value needs it)
        import numpy as np
        dtype, shape, data = np.dtype(str(v[0])), tuple(v[1]), decode_tagged(v[2])
        return np.array(data, dtype=dtype).reshape(shape)[()] if not shape else np.array(data, dtype=dtype)
    if tag == "__repr__":
        return Opaque(str(v[0]), str(v[1]))
    if tag == "__exception__":
        return CallException(str(v))
    raise ValueError(f"unknown tag {tag!r}")


# ---- LiveCodeBench's returned values ---------------------------------------------------------------------------

def jsonable(x):
    """Turn the program's return value into JSON data without changing what ``==`` would say against a JSON value.

    Values JSON cannot hold faithfully (a nested tuple, a set, a custom object, a dict with non-str keys) become
    a marker object that no gold JSON value equals, as they would compare unequal in LiveCodeBench's in-process
    ``==`` too.
    """
    t = type(x)
    if x is None or t is bool or t is int or t is float or t is str:
        return x
    if t is list:
        return [jsonable(v) for v in x]
    if t is dict and all(type(k) is str for k in x):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, bool):
        return bool(x)
    if isinstance(x, int) and not isinstance(x, bool):
        return int(x)
    if isinstance(x, float):
        return float(x)
    if isinstance(x, str):
        return str(x)
    if is_numpy(t) and getattr(x, "shape", None) == ():   # numpy scalars compare as the Python value they hold
        try:
            return jsonable(x.item())
        except Exception:
            pass
    if hasattr(t, "__index__") and not hasattr(t, "__len__"):   # other integer scalars
        return int(x.__index__())
    try:
        r = repr(x)[:200]
    except BaseException:
        r = "?"
    return {"__sandbox_unrepresentable__": t.__name__, "repr": r}

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
  JSON scalars as the scalar, numpy values with their dtype, ``collections``' Counter, OrderedDict and defaultdict
  with their items and their type once ``trust_collections`` ran, anything else as its type name and repr), and
  the grader decodes that (the dict subclasses as themselves; ``Opaque``, which equals nothing; ``CallException``).
  No code is evaluated either way, and what a program wrote is data: a malformed value, or a numpy value larger
  than the elements it carries, is a ValueError (the program's failure), never an allocation of its choosing.
- ``jsonable``: a returned value as plain JSON data for LiveCodeBench's ``==`` (function mode, ``lcb_call``).
"""

MEMORY_EXIT = 213                 # exit status the case process uses for an uncaught MemoryError
HOST_TMP = "/.host-tmp"           # where host paths under /tmp (a checkout or venv there) appear in the jail
HARNESS_MODES = ("lcb_stdin", "lcb_call", "evalplus")
TEST_MODES = ("checks", "assert")   # the modes whose verdict needs the epilogue's completion token (epilogue.py)

__all__ = ["CallException", "DICT_TYPES", "HARNESS_MODES", "HOST_TMP", "MEMORY_EXIT", "TEST_MODES", "Opaque",
           "decode_tagged", "encode_tagged", "is_numpy", "jail_path", "jsonable", "trust_collections"]


def jail_path(path):
    """Where a host path appears inside the jail: as itself, except under /tmp (the jail's /tmp is a fresh tmpfs),
    which moves to ``HOST_TMP`` (a checkout or venv under /tmp keeps its packages importable by programs)."""
    return HOST_TMP + path[4:] if path == "/tmp" or path.startswith("/tmp/") else path


def is_numpy(t):
    """Is ``t`` a numpy scalar or array type (told without importing numpy)?"""
    return getattr(t, "__module__", "") == "numpy" and hasattr(t, "dtype") and hasattr(t, "tolist")


# ---- tagged values ---------------------------------------------------------------------------------------------

DICT_TYPES = ("Counter", "OrderedDict", "defaultdict")   # collections' dict subclasses carried with their type
_TRUSTED_DICTS = {}   # class -> "collections.<name>", filled by ``trust_collections`` before any program runs


def trust_collections():
    """From now on ``encode_tagged`` carries ``collections``' Counter, OrderedDict and defaultdict with their items
    and their type. A harness calls it as it is imported, before any program runs: the classes are recognised by
    identity, so a program's own class (a subclass, a class named ``Counter``, a ``collections.Counter`` it
    replaced) is never taken for one of them."""
    import collections
    for name in DICT_TYPES:
        _TRUSTED_DICTS.setdefault(getattr(collections, name), "collections." + name)


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
    if t in _TRUSTED_DICTS:   # EvalPlus compares these in-process with their own == (Counter == dict as dicts...)
        return {"__dictsub__": [_TRUSTED_DICTS[t], [[encode_tagged(k, lenient), encode_tagged(v, lenient)]
                                                    for k, v in dict.items(x)]]}
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
    """A returned value of a type the sandbox does not carry across (decoded from ``{"__repr__": ...}``). Its type's
    name and the start of its repr were both written by the program: they are for messages, never a value. An
    Opaque equals nothing, not even another Opaque (a class named ``Counter`` prints whatever repr it likes, and a
    wrong value can agree with the right one for 200 characters)."""

    def __init__(self, type_name, text):
        self.type_name, self.text = type_name, text

    def __eq__(self, other):
        return False

    def __ne__(self, other):
        return True

    __hash__ = object.__hash__

    def __repr__(self):
        return f"<{self.type_name} {self.text}>"


class CallException:
    """The exception a call raised in ``mode="calls"`` (never equal to a value)."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return f"<exception {self.text}>"


def decode_tagged(x):
    """Tagged data back into Python values: tuples, sets, frozensets, dicts with any keys, complex, bytes,
    ``collections``' trusted dict subclasses, numpy values (numpy is imported only for those); an unknown type
    becomes ``Opaque``, a raised exception ``CallException``. No code is evaluated. A malformed or unknown tag is a
    ValueError, and so is a numpy value that asks for more than the elements it carries (``_numpy``)."""
    try:
        return _decode(x)
    except (TypeError, KeyError, IndexError, AttributeError, OverflowError, RecursionError) as e:
        raise ValueError(f"malformed tagged value: {type(e).__name__}: {e}"[:300]) from None


def _decode(x):
    if isinstance(x, list):
        return [_decode(v) for v in x]
    if not isinstance(x, dict):
        return x
    if len(x) != 1:
        raise ValueError(f"malformed tagged value with keys {sorted(x)[:5]}")
    (tag, v), = x.items()
    if tag == "__tuple__":
        return tuple(_decode(e) for e in v)
    if tag == "__set__":
        return {_decode(e) for e in v}
    if tag == "__frozenset__":
        return frozenset(_decode(e) for e in v)
    if tag == "__dict__":
        return {_decode(k): _decode(e) for k, e in v}
    if tag == "__dictsub__":   # a trusted dict subclass (``encode_tagged``): rebuilt as itself
        name, items = v
        if not isinstance(name, str) or name.partition(".")[::2] not in [("collections", n) for n in DICT_TYPES]:
            raise ValueError(f"unknown dict type {str(name)[:80]!r}")
        import collections
        pairs = [(_decode(k), _decode(e)) for k, e in items]
        if name == "collections.Counter":
            return collections.Counter(dict(pairs))   # (Counter(pairs) would count the pairs)
        return collections.OrderedDict(pairs) if name == "collections.OrderedDict" else collections.defaultdict(
            None, pairs)
    if tag == "__complex__":
        return complex(float(v[0]), float(v[1]))
    if tag == "__bytes__":
        return bytes.fromhex(v)
    if tag == "__numpy__":
        return _numpy(*v)
    if tag == "__repr__":
        return Opaque(str(v[0]), str(v[1]))
    if tag == "__exception__":
        return CallException(str(v))
    raise ValueError(f"unknown tag {tag!r}")


_NUMPY_KINDS = "?biufcUSO"   # what ``ndarray.tolist`` gives back as Python values: bool, numbers, str, bytes, objects
_NUMPY_SCALARS = (bool, int, float, complex, str, bytes)
_NUMPY_SPARE = 1 << 16       # bytes a numpy value may take beyond ``_NUMPY_PER_CHAR`` x the data it carries
_NUMPY_PER_CHAR = 16


def _numpy(dtype, shape, data):
    """A numpy scalar or array (``encode_tagged``: dtype string, shape, ``tolist()``), rebuilt from the elements the
    record carries, never from its word for their size: the dtype is a plain scalar type (no subarray dtype such as
    ``(1000,1000,60)<f8``, no fields), the data fills the shape exactly (nested lists of its lengths, scalars at the
    bottom), and a str/bytes array gets the width its strings need, at most ``_NUMPY_PER_CHAR`` bytes per character
    carried (a record's ``<U100000000`` would be 400 MB for one character). So the array is about the size of the
    record that described it. numpy is imported only here (only such a value needs it)."""
    import numpy as np
    text = str(dtype)
    head = text.lstrip("<>|=")[:1]
    if len(text) > 16 or not (head.isalpha() or head == "?"):   # '<f8', '|b1', '<U3': never '(1000,1000,60)<f8'
        raise ValueError(f"numpy dtype {text[:40]!r} is not a plain scalar type")
    dt = np.dtype(text)
    if dt.kind not in _NUMPY_KINDS or dt.subdtype is not None or dt.names is not None:
        raise ValueError(f"numpy dtype {text!r} is not carried (a plain bool, number, str, bytes or object dtype is)")
    if type(shape) is not list or len(shape) > 32 or not all(type(d) is int and d >= 0 for d in shape):
        raise ValueError(f"malformed numpy shape {str(shape)[:80]}")
    leaves = [_decode(data)]
    for d in shape:   # one level of nested lists per dimension, each of the dimension's length
        if not all(type(e) is list and len(e) == d for e in leaves):
            raise ValueError(f"numpy data does not fill its shape {tuple(shape)}")
        leaves = [e for row in leaves for e in row]
    if dt.kind == "O":
        arr = np.empty(len(leaves), dtype=object)
        for i, e in enumerate(leaves):
            arr[i] = e
        return arr.reshape(shape) if shape else arr[0]
    if not all(type(e) in _NUMPY_SCALARS for e in leaves):
        raise ValueError(f"numpy data of dtype {text!r} holds a value that is not a scalar")
    if dt.kind in "US":
        chars = [len(e) for e in leaves if isinstance(e, (str, bytes))]
        width = max(chars, default=1) * (4 if dt.kind == "U" else 1)
        if width * len(leaves) > _NUMPY_PER_CHAR * (sum(chars) + len(leaves)) + _NUMPY_SPARE:
            raise ValueError(f"a numpy {text!r} array of {len(leaves)} strings up to {max(chars)} long is wider than "
                             f"the data it carries")
        dt = np.dtype(dt.kind)   # the width its strings need
    arr = np.array(leaves, dtype=dt).reshape(shape)
    return arr[()] if not shape else arr


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

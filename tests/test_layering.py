"""The layering (docs/architecture.md "The stack"), read from the source with ``ast``: nothing is imported.

contracts (bottom) -> scoring -> inference -> trainer | eval -> tsanalysis -> figures -> demo | perf | notebooks.
A package imports only packages of lower layers (peers never import each other: eval and tsanalysis do not import
trainer, nor it them; the benchmark registry is scoring's, under both); no two modules or packages import each other, directly or round a longer loop, lazily or
not; scoring and contracts import no torch; nothing imports a CLI module or calls another module's ``main``.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# tsanalysis sits above eval (it reads eval's results files) but imports nothing from it: the sample-file format is
# contracts.samples, the model and context checks inference.hub, the batch grader and benchmark registry scoring's
LAYER = {"contracts": 0, "scoring": 1, "inference": 2, "trainer": 3, "eval": 3, "tsanalysis": 4, "figures": 5,
         "demo": 6, "perf": 6, "notebooks": 6}
NO_TORCH = {"scoring": ("torch", "transformers", "vllm"), "contracts": ("torch", "transformers", "vllm", "pandas")}
CLI_MODULES = {"tsanalysis.cli"}   # and every package's __main__


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, tuple[Path, str]]:
    """module name -> (file, source) for every module of the layered packages, and every notebook's code cells."""
    out = {}
    for pkg in LAYER:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            out[_module_name(path)] = (path, path.read_text(encoding="utf-8"))
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        code = "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))
        out[f"notebooks.{nb.stem}"] = (nb, code)
    return out


SOURCES = _sources()
MODULES = set(SOURCES)


def _resolve(name: str) -> str | None:
    """The project module an import names (the longest existing prefix), or None for a third-party one."""
    parts = name.split(".")
    while parts:
        cand = ".".join(parts)
        if cand in MODULES:
            return cand
        parts.pop()
    return None


def _imports(module: str, path: Path, source: str) -> list[tuple[str, int, str | None]]:
    """(imported name, line, attribute taken) for every import in the file, at any depth (lazy ones too)."""
    tree = ast.parse(source, filename=str(path))
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - (node.level - 1) - (0 if is_pkg else 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.append((sub, node.lineno, None) if sub in MODULES else (target, node.lineno, a.name))
    return out


def _edges() -> dict[str, dict[str, int]]:
    graph: dict[str, dict[str, int]] = {m: {} for m in MODULES}
    for m, (path, src) in SOURCES.items():
        for name, line, _ in _imports(m, path, src):
            target = _resolve(name)
            if target is not None and target != m:
                graph[m].setdefault(target, line)
    return graph


def _cycles(graph: dict[str, set[str] | dict]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


GRAPH = _edges()


def _where(src: str, dst: str) -> str:
    return f"{SOURCES[src][0].relative_to(ROOT)}:{GRAPH[src][dst]} imports {dst}"


def test_the_reader_sees_the_imports_it_must():
    # the checks below mean something only if the reader finds real edges, lazy ones inside functions included
    assert "inference.engines" in GRAPH["inference"] and "inference.hf" in GRAPH["inference.engines"]
    assert "scoring.verdict" in GRAPH["scoring.math"] and "contracts.records" in GRAPH["tsanalysis.io"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert len(MODULES) > 100 and any(m.startswith("notebooks.") for m in MODULES)


def test_no_module_cycles():
    cycles = _cycles(GRAPH)
    assert not cycles, "modules that import each other (directly or round a loop): " + "; ".join(
        " <-> ".join(c) for c in cycles)


def test_no_package_cycles_and_every_import_goes_down():
    packages = {p: set() for p in LAYER}
    wrong = []
    for src, targets in GRAPH.items():
        for dst in targets:
            a, b = src.split(".")[0], dst.split(".")[0]
            if a == b:
                continue
            packages[a].add(b)
            if LAYER[b] >= LAYER[a]:
                wrong.append(f"{_where(src, dst)} (layer {LAYER[a]} -> {LAYER[b]})")
    assert not _cycles(packages)
    assert not wrong, "imports that do not go down the stack:\n" + "\n".join(wrong)


@pytest.mark.parametrize("package", ["eval", "tsanalysis"])
def test_eval_and_tsanalysis_import_nothing_from_trainer(package):
    bad = [_where(s, d) for s, ts in GRAPH.items() if s.split(".")[0] == package for d in ts
           if d.split(".")[0] == "trainer"]
    assert not bad, bad


def test_tsanalysis_imports_nothing_from_eval():
    # what both need lives below them (contracts.samples, inference.hub, scoring): the analysis borrows nothing
    bad = [_where(s, d) for s, ts in GRAPH.items() if s.split(".")[0] == "tsanalysis" for d in ts
           if d.split(".")[0] == "eval"]
    assert not bad, bad


@pytest.mark.parametrize("package", sorted(NO_TORCH))
def test_bottom_layers_import_no_torch(package):
    banned = NO_TORCH[package]
    bad = [f"{SOURCES[m][0].relative_to(ROOT)}:{line} imports {name}"
           for m, (path, src) in SOURCES.items() if m.split(".")[0] == package
           for name, line, _ in _imports(m, path, src) if name.split(".")[0] in banned]
    assert not bad, bad


def test_nothing_imports_a_cli_module_or_calls_anothers_main():
    bad = []
    for m, (path, src) in SOURCES.items():
        if m.endswith(".__main__"):   # ``python -m package`` is the shell over the package's command
            continue
        for name, line, attr in _imports(m, path, src):
            target = _resolve(name)
            if target is None or target == m:
                continue
            if target in CLI_MODULES or target.endswith(".__main__"):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports the CLI module {target}")
            if attr == "main":
                bad.append(f"{path.relative_to(ROOT)}:{line} takes main() from {target}")
    assert not bad, bad


# Modules a command line or a config error reaches before any model is built: they load no torch, transformers or
# vLLM (a typo in a config or ``--help`` answers at once, not after seconds of imports).
LIGHT_MODULES = ("contracts.config", "inference.names", "inference.hub", "eval.config", "tsanalysis.cli")


@pytest.mark.slow   # a fresh interpreter
def test_config_and_command_modules_stay_light():
    import subprocess
    import sys
    code = ("import sys\n" + "".join(f"import {m}\n" for m in LIGHT_MODULES)
            + "print(sorted(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"{LIGHT_MODULES} loaded {out.stdout.strip()}"

"""tsanalysis.core is a pure layer: numpy/pandas only, no torch, trainer, eval, file IO."""

import json
import pathlib
import subprocess
import sys

import tsanalysis.core

FORBIDDEN = ["torch", "transformers", "vllm", "matplotlib", "pyarrow.parquet", "trainer", "eval", "inference",
             "tsanalysis.io", "tsanalysis.cli", "tsanalysis.relay", "tsanalysis.tables", "contracts.records"]
CORE = pathlib.Path(tsanalysis.core.__file__).parent


def test_core_imports_nothing_forbidden_in_a_fresh_interpreter():
    mods = ", ".join(f"tsanalysis.core.{p.stem}" for p in sorted(CORE.glob("*.py")) if p.stem != "__init__")
    code = f"import json, sys\nimport {mods}\nprint(json.dumps([m for m in {FORBIDDEN!r} if m in sys.modules]))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120,
                         cwd=CORE.parents[1])
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_core_sources_do_no_file_io():
    files = sorted(CORE.glob("*.py"))
    assert {f.name for f in files} >= {"bins.py", "truncation.py", "lemma4.py", "mismatch.py"}
    for f in files:
        text = f.read_text()
        for needle in ("open(", "to_parquet", "to_csv", "read_parquet", "import os", "pathlib"):
            assert needle not in text, f"{f.name} contains {needle!r}"

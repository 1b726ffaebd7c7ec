"""Loading cached analysis results and choosing each figure's inputs (used by ``figures.make_all`` and the notebooks).

``tsanalysis`` writes one folder per command (tables as ``<table>.parquet`` + ``.csv`` and a ``settings.json``
written last, so its presence marks a complete folder; see ``tsanalysis.io``). :func:`find_results` walks a
directory tree and returns every such folder as a :class:`ResultFolder` (command, run, tables, settings); the
layout above it does not matter: ``results/analysis/<run>/<command>/``, ``runs/<run>/analysis/...`` or a copied
tree all work.

The figure loaders take a directory (or a list of ResultFolders) and return exactly what the matching plotting
function takes:

=========================  ===========================================  ==============================
loader                     returns                                      plotting function
=========================  ===========================================  ==============================
:func:`relay_passk`        {benchmark: relay_passk}                     ``plot_relay_passk`` (Fig. 2)
:func:`positions_by_run`   {panel label: positions bins}                ``plot_positions`` (Fig. 3)
:func:`seeded_positions`   (bins, takeover)                             ``plot_seeded_positions`` (Fig. 4)
:func:`truncation_tokens`  (tokens, categories)                         ``plot_truncation_tokens`` (Fig. 5)
:func:`zero_adv`           (lemma4, by_step or None)                    ``plot_zero_adv`` (Lemma 4)
:func:`mismatch`           (relative, relative_to)                      ``plot_mismatch``
=========================  ===========================================  ==============================

Which run feeds which figure (when not given explicitly) is read from the run's ``config.yaml`` (found through
the ``run_dir`` recorded in settings.json), falling back on the tables themselves:

- Figure 3, panel (a) on-policy without mini-batching: ``algorithm: dapo`` and ``mini_batches_per_step: 1``
  (without a config: any run with no seeded responses); panel (b): ``algorithm: dapo`` and
  ``mini_batches_per_step > 1``.
- Figure 4: a run with seeded responses; preferred in this order: ``seed_loss: state+action``, ``seed_ratio``
  closest to 0.7, the longest ``seed_refresh_interval`` (the paper's Figure 4 run: state+action, 70 %, T = 16).
- Figure 5: per truncation rule (entropy first, then ratio), a run whose truncation table holds that rule;
  preferred: ``seed_rule`` equal to that rule, state+action, then for the later rules the same
  ``seed_refresh_interval``, ``seed_loss`` and ``seed_ratio`` as the run already chosen (a like-for-like pair).
- Lemma 4 by-step panel and the mismatch figure: a Thinking Seeds run, in the Figure 4 order.

When several runs qualify the first by run name is taken and the alternatives are reported through ``log``.
Errors (:class:`MissingResults`) name the ``tsanalysis`` command that writes the missing tables.

Every notebook reads one folder, :func:`results_dir`: ``$THINKING_SEEDS_RESULTS`` (``RESULTS_ENV``), by default
``runs/demo`` (``DEFAULT_RESULTS``, what ``make demo`` writes); point it at the DIR given to
``python -m figures.make_all`` (its tables are in ``DIR/analysis/``) or at its ``--results ROOT``
(``notebooks/README.md``).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

import pandas as pd
import yaml

__all__ = ["MissingResults", "ResultFolder", "COMMANDS", "HOW_TO", "RESULTS_ENV", "DEFAULT_RESULTS", "results_dir",
           "deprecated_env", "resolve_dir", "find_results", "read_table", "relay_passk", "positions_by_run",
           "seeded_positions", "truncation_tokens", "zero_adv", "mismatch", "FIG3_LABELS"]

REPO = Path(__file__).resolve().parents[1]
RESULTS_ENV = "THINKING_SEEDS_RESULTS"   # the one variable the notebooks read
DEFAULT_RESULTS = "runs/demo"            # what `make demo` (python -m demo) writes: analysis/, tables/, figures/
COMMANDS = ("positions", "truncation", "zero-adv", "mismatch", "relay", "support",   # support: figures.support
            "scaling")                                                             # scaling: figures.scaling
PRUNE_DIRS = {"rollouts", "checkpoints", "trainer_state", ".git", "__pycache__", ".ipynb_checkpoints", "node_modules",
          ".venv"}

# the tsanalysis command that writes each figure's inputs (printed when they are missing)
HOW_TO = {
    "fig2_relay": "tsanalysis relay --early RUN/checkpoints/step_A --final RUN/checkpoints/step_B --benchmarks NAME",
    "fig3_positions": "tsanalysis positions RUN_DIR  (an on-policy DAPO run; a second one with "
                      "mini_batches_per_step > 1 for panel (b))",
    "fig4_seeded_positions": "tsanalysis positions RUN_DIR  (a Thinking Seeds run, seed_loss state+action)",
    "fig5_truncation_tokens": "tsanalysis truncation RUN_DIR  (Thinking Seeds runs with seed_rule entropy and ratio)",
    "lemma4_zero_adv": "tsanalysis zero-adv --p 0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1 --G 8 --simulate 10000  "
                       "(and tsanalysis zero-adv RUN_DIR for the observed panel)",
    "mismatch": "tsanalysis mismatch RUN_DIR  (a Thinking Seeds run)",
}

FIG3_LABELS = {"onpolicy": "(a) on-policy, no mini-batching", "minibatch": "(b) on-policy, mini-batching"}


class MissingResults(FileNotFoundError):
    """The result tables a figure needs are not under the given directory."""


def deprecated_env(name: str, *, instead: str) -> str | None:
    """The value of a variable the notebooks used to read (None when unset or empty), with a one-line note on
    stderr saying what replaces it."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    print(f"note: {name} is deprecated and will not be read in a later version; {instead}", file=sys.stderr)
    return value


def results_dir(legacy: str | None = None) -> str:
    """The folder a notebook reads its tables from: ``$THINKING_SEEDS_RESULTS``, else the notebook's old variable
    ``legacy`` (deprecated, said in one line), else ``runs/demo``. A relative path is resolved by the loaders
    (:func:`resolve_dir`: the working directory, then the repository root)."""
    value = os.environ.get(RESULTS_ENV, "").strip()
    if value:
        if legacy and os.environ.get(legacy, "").strip():
            print(f"note: {legacy} is deprecated and not read: {RESULTS_ENV}={value} is", file=sys.stderr)
        return value
    old = deprecated_env(legacy, instead=f"set {RESULTS_ENV} instead (read this time)") if legacy else None
    return old or DEFAULT_RESULTS


def resolve_dir(path: str | os.PathLike) -> Path:
    """A results directory: as given if it exists (or is absolute), else relative to the repository root
    (notebooks run with the notebook folder as working directory)."""
    p = Path(path).expanduser()
    if p.exists() or p.is_absolute():
        return p
    alt = REPO / p
    return alt if alt.exists() else p


@dataclass(frozen=True)
class ResultFolder:
    """One complete tsanalysis result folder."""

    path: Path
    settings: dict = field(repr=False, compare=False)

    @property
    def command(self) -> str:
        return self.settings["command"]

    @property
    def tables(self) -> tuple[str, ...]:
        return tuple(self.settings["tables"])

    @property
    def run_dir(self) -> Path | None:
        """The run the tables were computed from (relay: the final checkpoint's run); None for pure tables."""
        if "run_dir" in self.settings:
            return Path(self.settings["run_dir"])
        if self.command == "relay":
            return _run_of_checkpoint(Path(self.settings["args"]["final"]))
        return None

    @property
    def run(self) -> str | None:
        return None if self.run_dir is None else self.run_dir.name

    @property
    def args(self) -> dict:
        return self.settings.get("args") or {}

    @property
    def mtime(self) -> float:
        return (self.path / "settings.json").stat().st_mtime

    def table(self, name: str) -> pd.DataFrame:
        return read_table(self.path, name)

    def config(self) -> dict:
        """The run's resolved config (config.yaml next to its rollouts); {} when the run directory is gone."""
        rd = self.run_dir
        if rd is None or not (rd / "config.yaml").is_file():
            return {}
        with open(rd / "config.yaml") as f:
            return yaml.safe_load(f) or {}


def _run_of_checkpoint(p: Path) -> Path:
    return p.parent.parent if p.parent.name == "checkpoints" else p


def read_table(folder: str | os.PathLike, name: str) -> pd.DataFrame:
    """``<folder>/<name>.parquet`` (or the CSV twin when the Parquet file is absent)."""
    folder = Path(folder)
    pq_path, csv_path = folder / f"{name}.parquet", folder / f"{name}.csv"
    if pq_path.is_file():
        return pd.read_parquet(pq_path)
    if csv_path.is_file():
        return pd.read_csv(csv_path)
    raise MissingResults(f"'{folder}' has no table '{name}' ({name}.parquet or {name}.csv)")


def _read_settings(path: Path) -> dict | None:
    try:
        s = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(s, dict) or s.get("command") not in COMMANDS or not isinstance(s.get("tables"), list):
        return None   # not a tsanalysis result folder (e.g. some other tool's settings.json)
    return s


def find_results(root: str | os.PathLike) -> list[ResultFolder]:
    """Every complete tsanalysis result folder under ``root`` (``root`` included), sorted by path."""
    root = Path(root)
    out = []
    if not root.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in PRUNE_DIRS)
        if "settings.json" in filenames:
            s = _read_settings(Path(dirpath) / "settings.json")
            if s is not None:
                out.append(ResultFolder(Path(dirpath), s))
    return sorted(out, key=lambda f: str(f.path))


# ---- choosing the folders of one figure ------------------------------------------------------------------------
Log = Callable[[str], None] | None


def _folders(source) -> tuple[list[ResultFolder], str]:
    if isinstance(source, (str, os.PathLike)):
        root = resolve_dir(source)
        if not root.exists():
            raise MissingResults(f"results directory '{source}' does not exist: run `python -m figures.make_all "
                                 f"RUN_OR_RESULTS_DIR` (or `make demo`) first, and point {RESULTS_ENV} at that "
                                 f"folder")
        return find_results(root), str(root)
    folders = list(source)
    return folders, "the given result folders"


def _with(folders: Iterable[ResultFolder], command: str, table: str) -> list[ResultFolder]:
    return [f for f in folders if f.command == command and table in f.tables]


def _missing(where: str, what: str, figure: str) -> MissingResults:
    return MissingResults(f"no {what} under {where}; write them with: {HOW_TO[figure]}")


def _match_run(folders: list[ResultFolder], run: str, what: str) -> ResultFolder:
    """The folder of run ``run`` (a run name or a run directory path)."""
    p = Path(run)
    hits = [f for f in folders if f.run == run or (f.run_dir is not None and p.exists()
                                                   and f.run_dir.resolve() == p.resolve())]
    if not hits:
        have = sorted({f.run for f in folders if f.run})
        raise MissingResults(f"no {what} for run '{run}' (runs with them: {', '.join(have) or 'none'})")
    return max(hits, key=lambda f: f.mtime)   # the newest when one run was analysed twice


def _pick(cands: list[ResultFolder], role: str, log: Log) -> ResultFolder:
    """The first candidate (already in preference order); report the alternatives."""
    chosen = cands[0]
    others = [f.run or str(f.path) for f in cands[1:]]
    if log is not None:
        log(f"{role}: run '{chosen.run}' ({chosen.path})"
            + (f"; also possible: {', '.join(others)} (choose explicitly to change)" if others else ""))
    return chosen


def _dedupe_runs(folders: list[ResultFolder]) -> list[ResultFolder]:
    """One folder per run (the newest), sorted by run name."""
    best: dict[str, ResultFolder] = {}
    for f in folders:
        key = str(f.run_dir) if f.run_dir is not None else str(f.path)
        if key not in best or f.mtime > best[key].mtime:
            best[key] = f
    return sorted(best.values(), key=lambda f: (f.run or "", str(f.path)))


def _seeded_responses(f: ResultFolder) -> int:
    return int(f.table("takeover")["seeded_responses"].iloc[0]) if "takeover" in f.tables else 0


# ---- one loader per figure -------------------------------------------------------------------------------------
def relay_passk(source, *, log: Log = None) -> dict[str, pd.DataFrame]:
    """Figure 2: {benchmark: relay_passk table} over every relay result folder (label = folder name when one
    benchmark has several folders, e.g. different cuts or checkpoints)."""
    folders, where = _folders(source)
    rel = _with(folders, "relay", "relay_passk")
    if not rel:
        raise _missing(where, "relay results (relay_passk)", "fig2_relay")
    bench = [str(f.args.get("benchmark") or f.path.name) for f in rel]
    out = {}
    for f, b in zip(rel, bench):
        label = b if bench.count(b) == 1 else f"{b} ({f.path.name})"
        out[label] = f.table("relay_passk")
        if log is not None:
            log(f"Figure 2: {label} from {f.path}")
    return out


def positions_by_run(source, mapping: Mapping[str, str] | None = None, *, log: Log = None) -> dict[str, pd.DataFrame]:
    """Figure 3: {panel label: positions bins}.

    mapping: {role: run}, roles ``onpolicy`` (panel a) and ``minibatch`` (panel b) get the paper's panel titles,
    any other key is used as the label. Without a mapping the runs are chosen from their configs (module
    docstring)."""
    folders, where = _folders(source)
    pos = _with(folders, "positions", "bins")
    if not pos:
        raise _missing(where, "positions results", "fig3_positions")
    if mapping:
        out = {}
        for role, run in mapping.items():
            f = _match_run(pos, run, "positions results")
            out[f"{FIG3_LABELS.get(role, role)} [{f.run}]"] = f.table("bins")
            if log is not None:
                log(f"Figure 3 {role}: run '{f.run}' ({f.path})")
        return out
    unseeded = [f for f in _dedupe_runs(pos) if _seeded_responses(f) == 0]
    roles: dict[str, list[ResultFolder]] = {"onpolicy": [], "minibatch": []}
    for f in unseeded:
        cfg = f.config()
        if not cfg:                      # no config: an unseeded run counts as plain on-policy
            roles["onpolicy"].append(f)
        elif cfg.get("algorithm") == "dapo":
            roles["minibatch" if int(cfg.get("mini_batches_per_step", 1)) > 1 else "onpolicy"].append(f)
    out = {}
    for role, cands in roles.items():
        if cands:
            f = _pick(cands, f"Figure 3 {role}", log)
            label = FIG3_LABELS[role]
            mb = f.config().get("mini_batches_per_step")
            if role == "minibatch" and mb:
                label += f", {int(mb)} updates per batch"
            out[f"{label} [{f.run}]"] = f.table("bins")
    if not out:
        raise _missing(where, "positions results of an on-policy DAPO run (no seeded responses)", "fig3_positions")
    return out


def seeded_positions(source, run: str | None = None, *, log: Log = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Figure 4: (bins, takeover) of a seeded run (``run`` or the preferred one: seed_loss state+action)."""
    folders, where = _folders(source)
    pos = _with(folders, "positions", "bins")
    if run is not None:
        f = _match_run(pos, run, "positions results")
    else:
        cands = [f for f in _dedupe_runs(pos) if _seeded_responses(f) > 0]
        if not cands:
            raise _missing(where, "positions results of a run with seeded responses", "fig4_seeded_positions")
        f = _pick(sorted(cands, key=_fig4_preference), "Figure 4", log)
    return f.table("bins"), f.table("takeover") if "takeover" in f.tables else None


def _fig4_preference(f: ResultFolder) -> tuple:
    """Sort key: state+action first, then seed_ratio closest to 0.7, then the longest refresh interval (a run
    without a config sorts after those with one; ties keep the run-name order)."""
    cfg = f.config()
    if not cfg:
        return (True, True, 0.0, 0)
    return (cfg.get("algorithm") != "seeds", cfg.get("seed_loss") != "state+action",
            abs(float(cfg.get("seed_ratio", 0.7)) - 0.7), -int(cfg.get("seed_refresh_interval", 0)))


_RULE_ORDER = ("entropy", "ratio")
_LIKE_FOR_LIKE = ("seed_refresh_interval", "seed_loss", "seed_ratio")


def truncation_tokens(source, mapping: Mapping[str, str] | None = None, *,
                      log: Log = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Figure 5: (tokens, categories) with one run per truncation rule (``mapping`` {rule: run} or automatic)."""
    folders, where = _folders(source)
    tr = _dedupe_runs(_with(folders, "truncation", "tokens"))
    if not tr:
        raise _missing(where, "truncation results", "fig5_truncation_tokens")
    tables = {f.path: (f.table("tokens"), f.table("categories")) for f in tr}
    chosen: dict[str, ResultFolder] = {}
    if mapping:
        for rule, run in mapping.items():
            f = _match_run(tr, run, "truncation results")
            if rule not in set(tables[f.path][0]["rule"]):
                raise MissingResults(f"run '{run}' has no cuts of the {rule} rule (its rules: "
                                     f"{', '.join(sorted(set(tables[f.path][0]['rule'])))})")
            chosen[rule] = f
    else:
        rules = sorted({r for tok, _ in tables.values() for r in tok["rule"]},
                       key=lambda r: (_RULE_ORDER.index(r) if r in _RULE_ORDER else len(_RULE_ORDER), r))
        for rule in rules:
            cands = [f for f in tr if rule in set(tables[f.path][0]["rule"])]
            ref = next(iter(chosen.values())).config() if chosen else {}

            def key(f, rule=rule, ref=ref):
                cfg = f.config()
                return (cfg.get("seed_rule", rule) != rule, cfg.get("seed_loss", "state+action") != "state+action",
                        sum(cfg.get(k) != ref[k] for k in _LIKE_FOR_LIKE if k in ref))
            chosen[rule] = _pick(sorted(cands, key=key), f"Figure 5 {rule} rule", log)
    tok = pd.concat([tables[f.path][0][lambda d, r=r: d["rule"] == r] for r, f in chosen.items()], ignore_index=True)
    cat = pd.concat([tables[f.path][1][lambda d, r=r: d["rule"] == r] for r, f in chosen.items()], ignore_index=True)
    return tok, cat


def _prefer_seeds(folders: list[ResultFolder]) -> list[ResultFolder]:
    return sorted(_dedupe_runs(folders), key=_fig4_preference)


def zero_adv(source, run: str | None = None, *, log: Log = None) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """Lemma 4: (the pure Lemma 4 table, all cached G values together; by_step of ``run`` or of the preferred
    run — a Thinking Seeds run, which holds on-policy and seeded groups — or None when no run was analysed)."""
    folders, where = _folders(source)
    l4 = _with(folders, "zero-adv", "lemma4")
    if not l4:
        raise _missing(where, "Lemma 4 tables (lemma4)", "lemma4_zero_adv")
    lemma4 = (pd.concat([f.table("lemma4") for f in sorted(l4, key=lambda f: -f.mtime)], ignore_index=True)
              .drop_duplicates(subset=["p", "G"], keep="first").sort_values(["G", "p"], ignore_index=True))
    runs = _with(folders, "zero-adv", "by_step")
    if run is not None:
        by_step = _match_run(runs, run, "zero-adv results").table("by_step")
    elif runs:
        by_step = _pick(_prefer_seeds(runs), "Lemma 4 observed panel", log).table("by_step")
    else:
        by_step = None
    return lemma4, by_step


def mismatch(source, run: str | None = None, *, log: Log = None) -> tuple[pd.DataFrame, str]:
    """Seed-token mismatch: (relative table, ``relative_to`` it was binned with: 'seed' or 'response')."""
    folders, where = _folders(source)
    mm = _with(folders, "mismatch", "relative")
    if not mm:
        raise _missing(where, "mismatch results", "mismatch")
    f = _match_run(mm, run, "mismatch results") if run is not None else _pick(_prefer_seeds(mm), "mismatch", log)
    return f.table("relative"), str(f.args.get("relative_to", "seed"))

"""docs/miniature.md is rendered from the tables demo.miniature collects beside it (issue #39 item 6), checked here on
a hand-made sweep folder (no training): sample files whose per-problem counts give round avg@n values, run folders
with a metrics.jsonl, a timings.json and the warm-ups' summaries, for the addition table and the code one.

The page written from the run folders is what the tables folder alone renders (the run folders deleted); its numbers
are the hand-derived ones and what ``tests.helpers.pages.recompute`` gets from the per-problem counts with
contracts.passk and demo.miniature.t_interval; a tampered count or cell is caught.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from contracts.passk import summarize
from contracts.samples import read_samples
from demo import miniature
from demo.common import figure_dir
from demo.addition import CODE, FULL
from demo.page_numbers import parse_page
from eval.metrics import counts
from tests.helpers.pages import TAMPER_FINDS, generated_part, recompute, rerender, tamper, writer

# {model: correct samples of each held-out problem}; 4 problems x FULL.eval_n = 8 samples, so avg@n = sum / 32
ADDITION = {"warmup": [2, 2, 2, 2],
            "onpolicy": [4, 4, 4, 4], "onpolicy-seed1": [5, 5, 5, 5], "onpolicy-seed2": [6, 6, 6, 6],
            "seeds_ratio": [6, 4, 4, 4], "seeds_ratio-seed1": [7, 5, 5, 5], "seeds_ratio-seed2": [6, 6, 6, 6],
            "m2po": [3, 3, 3, 3], "m2po-seed1": [5, 5, 5, 5],          # two seeds; seed 1 has no run folder
            "luffy-seed2": [7, 7, 7, 7],                                 # one seed: no interval
            "onpolicy-seed5": [8, 8, 8, 8]}                              # beyond --seeds 3: scored, not in the table
# 2 problems x CODE.eval_n = 4 samples
MINICODE = {"warmup": [2, 0], "code_onpolicy": [4, 2], "code_seeds_state_action-seed1": [3, 3]}
# {run: (step times, tokens generated per step)}: the sums are the page's train wall s and tokens
METRICS = {"onpolicy": ([10.0, 20.0], [500, 500]), "onpolicy-seed1": ([20.0, 20.0], [1000, 1000]),
           "onpolicy-seed2": ([25.0, 25.0], [1500, 1500]), "seeds_ratio": ([30.0, 30.0], [2000, 2000]),
           "seeds_ratio-seed1": ([30.0, 31.0], [2000, 2001]), "seeds_ratio-seed2": ([32.0, 31.0], [2002, 2003]),
           "m2po": ([30.0, 30.0], [700, 700]), "luffy-seed2": ([12.5, 12.5], [900, 901]),
           "onpolicy-seed5": ([1.0], [1])}
TIMINGS = {"onpolicy": (30.5, 1, 1.5), "onpolicy-seed1": (40.0, 1, 2.5), "onpolicy-seed2": (50.0, 1, 3.0),
           "seeds_ratio": (61.0, 2, 1.0), "luffy-seed2": (24.0, 1, 2.0)}   # run: (CPU s, threads, 1-minute load)


def _scored(folder: Path, task: str, n: int, models: dict[str, list[int]]) -> None:
    for model, correct in models.items():
        f = folder / "eval" / model / f"{task}.jsonl"
        f.parent.mkdir(parents=True)
        f.write_text("".join(json.dumps({"problem_id": f"{task}-{i}", "correct": [j < c for j in range(n)]}) + "\n"
                             for i, c in enumerate(correct)))
    (folder / "warmup").mkdir()


def sweep_folder(root: Path) -> Path:
    """A sweep folder as ``demo.miniature.sweep`` leaves it (and its ``-code`` sibling), written by hand."""
    out, code = root / "mini", root / "mini-code"
    _scored(out, "addition", FULL.eval_n, ADDITION)
    _scored(code, "minicode", CODE.eval_n, MINICODE)
    for run, (times, toks) in METRICS.items():
        (out / "runs" / run).mkdir(parents=True)
        (out / "runs" / run / "metrics.jsonl").write_text("".join(
            json.dumps({"step": i, "time/step_s": t, "tokens/generated": k}) + "\n"
            for i, (t, k) in enumerate(zip(times, toks))))
    (out / miniature.TIMINGS).write_text(json.dumps({r: {"wall_s": 0.0, "cpu_s": c, "threads": t, "load_1min": load}
                                                     for r, (c, t, load) in TIMINGS.items()}))
    (out / "warmup" / "warmup_summary.json").write_text(json.dumps({"steps": 367, "loss_last": 0.0941}))
    (code / "warmup" / "warmup_summary.json").write_text(json.dumps({"steps": 195, "loss_last": 0.0093}))
    (out / miniature.MEASURED).write_text(json.dumps({"machine": "a toy machine, 2 CPU cores", "commit": "abc1234"}))
    return out


@pytest.fixture
def written(tmp_path) -> tuple[Path, Path]:
    """(the page written by ``python -m demo.miniature --seeds 3 --write-only --doc``, the sweep folder)."""
    out = sweep_folder(tmp_path)
    doc = tmp_path / "docs" / "miniature.md"
    doc.parent.mkdir()
    doc.write_text(f"# old page\n\n{miniature.NOTES_HEADING}\n\n- the warm-up scores 25.0 % (t = 4.3).\n")
    assert miniature.main(["--seeds", "3", "--write-only", "--out", str(out), "--doc", str(doc)]) == 0
    return doc, out


def test_the_page_from_the_tables_alone_is_the_page_from_the_run_folders(written):
    doc, out = written
    page = doc.read_text()
    tdir = doc.parent / "miniature" / "tables"
    assert figure_dir(doc) == tdir.parent    # demo.common's rule, the premise writer's too
    assert writer(tdir) == "demo.miniature" and sorted(p.name for p in tdir.iterdir()) == [
        "methods.csv", "notes_sources.json", "page.json", "per_problem.csv", "runs.csv", "warmup.json"]
    assert sum(f.stat().st_size for f in tdir.iterdir()) < 64_000       # kilobytes
    # each run's avg@n on the page is its sample file's, read as the page read it before the tables existed
    t = parse_page(generated_part(page)).table("Held-out avg@n")
    for model, seed in (("onpolicy", 0), ("seeds_ratio", 1), ("luffy", 2), ("m2po", 1)):
        rn = model if seed == 0 else f"{model}-seed{seed}"
        _, n, c = counts(read_samples(out / "eval" / rn / "addition.jsonl"))
        assert f"{100 * summarize(n, c, ks=[1])['avg']:.1f}" in t.cell(miniature.label(model, FULL), "per seed")
    # the run folders gone, the tables folder alone renders the same page
    shutil.rmtree(out)
    shutil.rmtree(out.with_name("mini-code"))
    assert rerender(doc) == generated_part(page)
    assert page.rstrip().endswith("- the warm-up scores 25.0 % (t = 4.3).")     # the notes are kept, unmarked
    assert "numbers below not matching" not in page


def test_the_page_shows_the_hand_derived_numbers(written):
    doc, _ = written
    page = parse_page(generated_part(doc.read_text()))
    t, code = page.table("Held-out avg@n"), page.table("Code (Table 2's rows)")

    def row(table, label):
        return table.row(label)[1:]

    # on-policy 16, 20, 24 of 32 correct: 50.0, 62.5, 75.0; s = 12.5, t_{0.975, 2} = 4.3027 -> ± 31.05
    assert row(t, "supervised warm-up (no RL)") == ["25.0 (one model)", "–", "–", "–", "–", "–", "–"]
    assert row(t, "On-policy (DAPO)") == ["62.5 ± 31.1", "3/3", "50.0, 62.5, 75.0", "–", "40", "40", "2000"]
    # seeds ratio 18, 22, 24: s = 9.547 -> ± 23.72; differences +6.25, +6.25, 0 (s = 3.608 -> ± 8.96); CPU s of
    # seed 0 only
    assert row(t, label := miniature.label("seeds_ratio", FULL)) == [
        "66.7 ± 23.7", "3/3", "56.2, 68.8, 75.0", "+4.2 ± 9.0 (k=3)", "61", "61", "4002"], label
    # M2PO 37.5, 62.5 (t_{0.975, 1} = 12.706): differences −12.5 and 0 -> −6.25 ± 79.4; seed 1 has no run folder
    assert row(t, "M2PO") == ["50.0 ± 158.8", "2/3", "37.5, 62.5", "-6.2 ± 79.4 (k=2)", "30", "", "700"]
    assert row(t, "LUFFY") == ["87.5", "1/3", "87.5", "+12.5 (k=1)", "25", "24", "1801"]
    assert row(t, miniature.label("seeds_entropy", FULL)) == ["not run", "0/3", "", "", "", "", ""]
    # code: on-policy seed 0 only (6 of 8), the seeded run seed 1 only: nothing to pair
    assert row(code, "supervised warm-up (no RL)")[0] == "25.0 (one model)"
    assert row(code, "On-policy (DAPO)") == ["75.0", "1/3", "75.0", "–", "0", "", "0"]
    assert row(code, miniature.CODE_LABELS["code_seeds_state_action"])[3] == "no paired seed"
    assert "warm-up 367 steps" in doc.read_text() and "warm-up 195 supervised steps" in doc.read_text()
    written_line = next(s for s in page.sentences if s.startswith("Page written"))
    assert "from 11 scored models and 9 run folders under" in written_line and "commit abc1234" in written_line
    assert "a toy machine, 2 CPU cores. Training used 1, 2 torch thread(s)" in doc.read_text()
    assert "1-minute load average 1.0-3.0" in doc.read_text()


def test_the_statistics_recompute_from_the_per_problem_counts(written):
    doc, _ = written
    tdir = doc.parent / "miniature" / "tables"
    assert recompute(tdir) == []
    # by hand from per_problem.csv: avg@n of each seed, the t-interval over seeds, the paired differences
    pp = miniature.read_table(tdir, miniature.PER_PROBLEM)
    avg = {m: (d["correct"] / d["n"]).mean() for m, d in pp[pp["task"] == "addition"].groupby("model")}
    mean, hw = miniature.t_interval([avg["m2po"], avg["m2po-seed1"]])
    d = [avg["m2po"] - avg["onpolicy"], avg["m2po-seed1"] - avg["onpolicy-seed1"]]
    assert (mean, hw) == pytest.approx((0.5, miniature.t975(1) * math.sqrt(2 * 0.125 ** 2) / math.sqrt(2)))
    assert miniature.t_interval(d) == pytest.approx((-0.0625, miniature.t975(1) * 0.125 / math.sqrt(2) / math.sqrt(2)))
    # what each derived phrase of the notes gave on this page
    notes = json.loads((tdir / "notes_sources.json").read_text())
    t_phrase = next(x for x in notes if x["phrase"] == "(t = 4.3)")
    assert t_phrase["values"] == pytest.approx([miniature.t975(2)])
    assert len(notes) == len(miniature.NOTES_SOURCES)


def test_a_tampered_count_or_cell_is_caught(written, tmp_path):
    doc, _ = written
    into = tmp_path / "tampered"
    into.mkdir()
    bad, differs = tamper(doc, into)
    for prefix in TAMPER_FINDS["demo.miniature"]:
        assert any(b.startswith(prefix) for b in bad), (prefix, bad)
    assert differs


def test_a_regenerated_miniature_page_is_checked_like_the_premise_pages(written, tmp_path, monkeypatch):
    """tests/demo/test_pages.py's four checks, with docs/ holding the toy page and its tables as
    ``python -m demo.miniature --doc docs/miniature.md`` leaves them, and only that page measured (test_pages checks
    the other committed pages itself)."""
    from tests.demo import test_pages as committed
    doc, _ = written
    monkeypatch.setattr(committed, "DOCS", doc.parent)
    monkeypatch.setattr(committed, "MEASURED", ("miniature.md",))
    assert committed._with_tables() == ["miniature.md"]
    committed.test_every_measured_page_has_its_tables_or_says_it_has_none()
    committed.test_each_page_is_what_its_committed_tables_render()
    committed.test_the_committed_tables_are_what_their_per_problem_counts_give()
    into = tmp_path / "tampered-committed"
    into.mkdir()
    committed.test_a_changed_count_or_cell_is_caught(into)
    # a hand edit of one cell of the page is caught by the re-render
    doc.write_text(doc.read_text().replace("| 62.5 ± 31.1 |", "| 62.6 ± 31.1 |"))
    with pytest.raises(AssertionError):
        committed.test_each_page_is_what_its_committed_tables_render()

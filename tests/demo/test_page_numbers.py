"""Every number in the hand-written notes of docs/miniature.md, docs/premise.md and docs/exploration.md is accounted
for (issue #23 item 6): a value of the page's generated tables or text, a derivation listed in the page writer's
NOTES_SOURCES, or a cited source (demo.page_numbers). Pure text, no runs needed; the writers run the same check on
every write."""

from __future__ import annotations

import re
import subprocess

import pytest

from demo import miniature, premise_page
from demo.common import REPO
from demo.page_numbers import STALE_LINE, Cited, audit, clean, mark, mentions, parse_page, report, split, stale, unused

PAGES = {"miniature": (REPO / "docs" / "miniature.md", miniature.NOTES_HEADING, miniature.NOTES_SOURCES),
         "premise": (REPO / "docs" / "premise.md", premise_page.NOTES_HEADING, premise_page.NOTES_SOURCES),
         # the premise regime with other rows (python -m demo.premise --doc docs/exploration.md)
         "exploration": (REPO / "docs" / "exploration.md", premise_page.NOTES_HEADING, premise_page.EXPLORATION_SOURCES),
         # the power study (python -m demo.premise --endpoints --doc docs/power.md)
         "power": (REPO / "docs" / "power.md", premise_page.NOTES_HEADING, premise_page.POWER_SOURCES)}
MIN_NUMBERS = {"power": 25}   # numbers the audit must have read in a page's notes (default 80)


def _page(name: str) -> tuple[str, str, str, tuple]:
    path, heading, sources = PAGES[name]
    generated, notes = split(path.read_text(), heading)
    assert notes.startswith(heading), f"{path} has no {heading!r} section"
    return generated, notes, heading, sources


def _edit(notes: str, old: str, new: str) -> str:
    """``notes`` with the phrase ``old`` (across line breaks) replaced by ``new``."""
    rx = r"\s+".join(map(re.escape, old.split()))
    assert len(re.findall(rx, notes)) == 1, old
    return re.sub(rx, new, notes)


@pytest.mark.parametrize("name", sorted(PAGES))
def test_every_number_of_the_notes_is_accounted_for(name):
    generated, notes, _, sources = _page(name)
    found = audit(generated, notes, sources)
    assert len([f for f in found if f.mention.nums]) > MIN_NUMBERS.get(name, 80)   # the notes were read, not skipped
    bad = [f for f in found if f.why is None]
    assert not bad, f"{PAGES[name][0]}: numbers of the notes that no table, derivation or source gives:\n{report(bad)}"
    assert not unused(notes, sources), "NOTES_SOURCES entries whose phrase is not (once) in the notes"


def test_the_forms_of_a_number():
    text = clean("gains 2.3-4.6 points, −1.2 ± 3.1, +9.9 points [+6.2, +13.5], 82 % and 1.30 x, 2.6× at "
                 "pass@64, 296k tokens, lr 6e-4, numbers 1..20, ±1.4-2.8, 0.30 -> 0.17")
    got = [(m.kind, [n.value for n in m.nums]) for m in mentions(text)]
    assert got == [("range", [2.3, 4.6]), ("pm", [-1.2, 3.1]), ("interval", [9.9, 6.2, 13.5]), ("single", [82]),
                   ("single", [1.30]), ("single", [2.6]), ("metric k", [64]), ("single", [296000]),
                   ("single", [pytest.approx(6e-4)]), ("range", [1, 20]), ("range", [1.4, 2.8]),
                   ("single", [0.30]), ("single", [0.17])]
    steps = [n.step for m in mentions(text) for n in m.nums]
    assert steps[:3] == [0.1, 0.1, 0.1] and steps[7] == 1 and steps[11] == 1000   # the displayed precision


def test_digits_that_are_no_measurement_are_named_by_a_rule():
    text = clean("commit 2226b63 on an AVX-512 Xeon, issue #13, §3, Figure 2, rerun 2026-12-01 at 13:39, `--seeds 3`")
    assert {(m.text, m.kind) for m in mentions(text)} == {
        ("2226b63", "commit hash"), ("AVX-512", "name"), ("issue #13", "reference"), ("§3", "reference"),
        ("Figure 2", "reference"), ("2026-12-01", "date or time"), ("13:39", "date or time"),
        ("`--seeds 3`", "code span")}


def test_a_hash_that_reads_as_a_float_is_no_crash():
    """9e61921 is a commit hash, and a float of 10^61921 read naively (an OverflowError stopped the premise writer):
    after "commit" it is a hash; elsewhere an infinite value, which no table shows, so it is reported, not a crash."""
    from demo.page_numbers import parse_num
    assert [(m.text, m.kind) for m in mentions(clean("commit 9e61921 and commits 9e61921"))] == [
        ("9e61921", "commit hash"), ("9e61921", "commit hash")]
    assert (parse_num("9e61921").value, parse_num("9e61921").step, parse_num("1e-400").value) == (float("inf"), 0.0, 0.0)
    generated, notes, _, sources = _page("premise")
    found = stale(generated, notes + "\n- **New.** Trained up to 9e61921.\n", sources)
    assert [f.mention.text for f in found] == ["9e61921"]


def test_a_number_from_no_table_is_reported_with_its_sentence():
    generated, notes, _, sources = _page("miniature")
    old = _edit(notes, "gains 4.7-7.7 points over the warm-up", "gains 9.1-9.9 points over the warm-up")
    found = stale(generated, old, sources)
    assert [f.mention.text for f in found] == ["9.1-9.9"]
    assert "every method gains 9.1-9.9 points over the warm-up's 27.8 %" in found[0].sentence
    # the derivation's phrase went with the edit: its entry is listed, so NOTES_SOURCES does not rot
    assert [s.phrase for s in unused(old, sources)] == ["gains 4.7-7.7 points over the warm-up"]
    added = notes + "\n- **New.** LUFFY gains 7.7 points.\n"
    assert [(f.mention.text, f.sentence) for f in stale(generated, added, sources)] == [
        ("7.7", "LUFFY gains 7.7 points.")]


def test_a_derivation_the_tables_no_longer_give_is_reported():
    generated, notes, _, sources = _page("miniature")
    rerun = generated.replace("| 32.5 ± 5.9 |", "| 32.0 ± 5.9 |")   # M2PO's mean, the lowest RL row, moved
    assert rerun != generated
    found = stale(rerun, notes, sources)
    assert [f.mention.text for f in found] == ["gains 4.7-7.7 points over the warm-up"]
    assert found[0].sentence.endswith("[min and max over the RL rows of mean − the warm-up's: gives 4.2, 7.7]")
    # a table not run yet: the derivation cannot be computed, and says so instead of failing the write
    [f] = stale("| method | seeds |\n|---|---|\n", "## Reading the table\n\n(t = 4.3)\n", sources)
    assert f.mention.text == "(t = 4.3)" and "cannot be computed from these tables" in f.sentence


def test_a_half_width_must_come_from_the_same_cell():
    generated, _, heading, sources = _page("miniature")
    # M2PO's mean difference with the `state` row's half-width: both numbers are on the page, not together
    assert [f.mention.text for f in stale(generated, f"{heading}\n\nM2PO is −2.2 ± 2.0.\n", ())] == ["−2.2 ± 2.0"]
    assert not stale(generated, f"{heading}\n\nM2PO is −2.2 ± 3.5.\n", ())
    # rounding to the precision the prose shows is allowed (27.8 % shown as 28 %), more precision is not
    assert not stale(generated, f"{heading}\n\nthe warm-up scored 28 %.\n", ())
    assert stale(generated, f"{heading}\n\nthe warm-up scored 27.80 %.\n", ())


def test_t_quantiles_have_no_normal_fallback():
    """t975 is scipy's quantile at every df: the printed table's values to 3 decimals up to 10 (the pages' t = 4.3 /
    4.30 are t975(2)), and beyond it still a t quantile, above z = 1.96 (the old table fell back to 1.96 past 10
    degrees of freedom, 11 seeds)."""
    table = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
             11: 2.201, 20: 2.086, 30: 2.042}
    for df, t in table.items():
        assert miniature.t975(df) == pytest.approx(t, abs=5e-4), df
    assert miniature.t975(1000) > 1.96
    mean, hw = miniature.t_interval([0.1 * (i % 3) for i in range(12)])   # 12 seeds: df 11, t = 2.201, not 1.96
    sd = (sum((0.1 * (i % 3) - mean) ** 2 for i in range(12)) / 11) ** 0.5
    assert hw == pytest.approx(miniature.t975(11) * sd / 12 ** 0.5) and hw > 1.96 * sd / 12 ** 0.5 * 1.12


def test_numbers_cited_from_the_previous_page_are_on_it():
    """The miniature notes quote the page at commit 56ef472 ("was 30.1 ± 0.6"): each such number is on that page."""
    cited = [s for s in miniature.NOTES_SOURCES if isinstance(s, Cited) and "at commit 56ef472" in s.source]
    assert len(cited) >= 5
    proc = subprocess.run(["git", "show", "56ef472:docs/miniature.md"], cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"commit 56ef472 is not in this checkout: {proc.stderr.strip()}")
    old = proc.stdout
    for src in cited:
        assert not stale(old, f"## notes\n\n{src.phrase}\n", ()), src.phrase


def test_mark_writes_one_visible_line_and_replaces_it():
    generated, notes, heading, sources = _page("miniature")
    bad = _edit(notes, "gains 4.7-7.7 points", "gains 4.7-7.9 points")
    page, found = mark(generated + bad, heading, sources)
    lines = [x for x in page.splitlines() if x.startswith(STALE_LINE)]
    assert found and len(lines) == 1 and "4.7-7.9" in lines[0]
    assert page.split(heading + "\n\n", 1)[1].startswith(STALE_LINE)    # right under the heading
    again, _ = mark(page, heading, sources)
    assert again == page                                                  # a rewrite does not stack lines
    fixed, none = mark(again.replace("gains 4.7-7.9 points", "gains\n  4.7-7.7 points"), heading, sources)
    assert not none and STALE_LINE not in fixed and fixed == generated + notes


def test_the_miniature_writer_marks_stale_numbers(tmp_path, capsys):
    doc, out = tmp_path / "miniature.md", tmp_path / "nothing-run-yet"
    assert miniature.main(["--seeds", "3", "--write-only", "--out", str(out), "--doc", str(doc)]) == 0
    generated = doc.read_text().split(miniature.NOTES_HEADING)[0]   # a new page carries the committed page's notes
    doc.write_text(generated + f"{miniature.NOTES_HEADING}\n\n- every method gains 2.3-4.6 points.\n")
    capsys.readouterr()
    assert miniature.main(["--seeds", "3", "--write-only", "--out", str(out), "--doc", str(doc)]) == 0
    err, page = capsys.readouterr().err, doc.read_text()
    assert "warning: 1 numbers of the notes" in err and "'2.3-4.6' in: - every method gains" in err
    assert [x for x in page.splitlines() if x.startswith(STALE_LINE)] == [
        f"{STALE_LINE} 2.3-4.6 (rewrite them from the tables, or fix their NOTES_SOURCES entry)"]


def test_the_premise_writer_marks_stale_numbers(tmp_path, monkeypatch):
    generated, notes, heading, _ = _page("premise")
    before_grid = generated[:generated.index("## Grid searched")]
    monkeypatch.setattr(premise_page, "render_page", lambda tables, b, **kw: before_grid)
    (tmp_path / "tables").mkdir()
    monkeypatch.setattr(premise_page, "collect_inputs", lambda out: tmp_path / "tables")
    monkeypatch.setattr(premise_page, "page_record", lambda out, b, **kw: {})
    doc, logs = tmp_path / "premise.md", []
    doc.write_text(generated + _edit(notes, "k = 9.3 [4.1, 46.7]", "k = 9.3 [4.1, 31.4]"))
    page = premise_page.write_page(tmp_path / "out", premise_page.PREMISE, doc=doc, log=logs.append)
    assert page == doc.read_text() and f"{STALE_LINE} 9.3 [4.1, 31.4]" in page
    assert any(x.startswith("warning: 1 numbers") and "9.3 [4.1, 31.4]" in x for x in logs)
    doc.write_text(generated + notes)                                      # the page as committed: nothing marked
    assert premise_page.write_page(tmp_path / "out", premise_page.PREMISE, doc=doc, log=logs.append) == \
        generated + notes


def test_the_generated_part_is_parsed():
    generated, *_ = _page("miniature")
    page = parse_page(generated)
    t = page.table("Held-out avg@n")
    assert t.nums("M2PO", "per seed") == [34.4, 29.8, 33.1] and t.num("M2PO", "tokens") == 295740
    assert len(t.rows) == 12 and [x.heading for x in page.tables][1].startswith("Code")
    assert not any("Measured before" in s for s in page.sentences)        # the hand-written banner is no source

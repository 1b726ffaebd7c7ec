"""The measured pages against the tables committed beside them (issue #39 item 6).

A page written by ``demo.premise`` or ``demo.miniature`` carries its tables in ``docs/<page>/tables/``: its generated
part must be what those tables render (``tests.helpers.pages.rerender``), and the tables' statistics must be what
their per-problem counts give (``recompute``). A measured page without committed tables must say so at its top, so
that a reader knows its numbers cannot be checked yet. tests/demo/test_miniature_tables.py runs these checks on a
hand-made miniature folder until docs/miniature.md is regenerated with its tables.
"""

from __future__ import annotations

import pytest

from demo.common import REPO
from demo.common import figure_dir
from tests.helpers.pages import TAMPER_FINDS, generated_part, recompute, rerender, tamper, writer

DOCS = REPO / "docs"
MEASURED = ("premise.md", "exploration.md", "miniature.md", "power.md")
NOT_COMMITTED = "**Tables not committed**"


def _with_tables() -> list[str]:
    return [p for p in MEASURED if (figure_dir(DOCS / p) / "tables" / "page.json").is_file()]


def test_every_measured_page_has_its_tables_or_says_it_has_none():
    for page in MEASURED:
        text = (DOCS / page).read_text()
        has = page in _with_tables()
        assert has != (NOT_COMMITTED in text.split("\n## ", 1)[0]), (
            f"docs/{page}: " + ("has tables but still says it has none" if has else
                                f"no docs/{figure_dir(DOCS / page).name}/tables/page.json and no "
                                f"{NOT_COMMITTED!r} note at its top"))


def _pages_with_tables() -> list[str]:
    pages = _with_tables()
    if not pages:
        pytest.skip("no measured page has committed tables yet (each says so at its top): regenerate one, e.g. "
                    "python -m demo.premise --write-only --doc docs/premise.md")
    return pages


def test_each_page_is_what_its_committed_tables_render():
    for page in _pages_with_tables():
        doc = DOCS / page
        assert rerender(doc) == generated_part(doc.read_text()), page


def test_the_committed_tables_are_what_their_per_problem_counts_give():
    for page in _pages_with_tables():
        assert recompute(figure_dir(DOCS / page) / "tables") == [], page


def test_a_changed_count_or_cell_is_caught(tmp_path):
    """The two checks can fail: one problem's correct count changed, or one cell of the methods table edited."""
    doc = DOCS / _pages_with_tables()[0]
    bad, differs = tamper(doc, tmp_path)
    for prefix in TAMPER_FINDS[writer(figure_dir(doc) / "tables")]:
        assert any(b.startswith(prefix) for b in bad), (prefix, bad)
    assert differs


def test_the_premise_pages_cited_entropy_is_its_committed_table():
    """The one premise note the number audit takes as cited (a cell of no rendered table): position 1's entropy at
    the first and last step, read from the committed entropy_positions.csv."""
    import pandas as pd
    tdir = figure_dir(DOCS / "premise.md") / "tables"
    if not (tdir / "page.json").is_file():
        pytest.skip("docs/premise.md has no committed tables")
    e = pd.read_csv(tdir / "entropy_positions.csv")
    first, last = (e[(e["position"] == 1) & (e["step"] == s)]["entropy"].item() for s in (e["step"].min(),
                                                                                           e["step"].max()))
    steps = int(e["step"].max()) + 1
    assert (f"at position 1: {first:.2f} nats in step 1, {last:.2f} in step {steps}"
            in " ".join((DOCS / "premise.md").read_text().split()))

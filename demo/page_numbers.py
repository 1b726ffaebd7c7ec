"""Every number in a measured page's hand-written notes, accounted for by the page's generated part (issue #23 item 6).

``docs/miniature.md`` and ``docs/premise.md`` are written from cached tables, and keep a hand-written section from a
heading on across rewrites. A rerun that changes the tables must not leave prose quoting the old numbers, so every
number of the notes is accounted for in one of three ways (``audit``), else it is reported (``stale``):

(a) **on the page**: it is a value of the generated part above the notes at its displayed precision (a cell of a
    markdown table, or a number of the generated prose: the Budget / Regime / Machine-and-cost text), compared by
    value at the precision the notes show it ("82 %" matches a cell 82.4). "a ± b" and "a [l, h]" must come from ONE
    cell (or one generated sentence): a half-width of another row does not count;
(b) **derived**: a ``Derived`` entry of the page names a phrase of the notes and computes its numbers from named
    cells of the parsed tables (``Page``), compared at the displayed precision;
(c) **cited**: a ``Cited`` entry names a phrase and where its numbers come from (the paper's table, a commit and
    command that measured a side result); or a rule of ``RULES`` says the digits are no measurement (a date, a
    commit hash, an issue or figure number, a name such as AVX-512, text in a code span).

Pure text: no file IO, so the test and the page writers (``demo.miniature``, ``demo.premise_page``) run the same
check; the writers print the stale numbers and put a visible ``STALE_LINE`` under the notes' heading.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable, Sequence

# ------------------------------------------------------------------------------------------------------------
# numbers in text
# ------------------------------------------------------------------------------------------------------------
_SIGN = r"[+\-−±]?"
_ATOM = (r"(?<![\w@])(?<!\d\.)" + _SIGN + r"\d+(?:\.\d+)?(?:e[+\-−]?\d+)?"
         r"(?:\s?%|\s?x(?![A-Za-z\d])|×|[kmM](?![A-Za-z\d]))?(?!\w)(?!\.\d)")
# "@64" (pass@64, avg@8) is the number of a metric's name, compared like any other
_AT = r"(?<=@)\d+(?!\w)(?!\.\d)"
_A = f"(?:{_ATOM}|{_AT})"
# compound mentions, tried in this order at each position
_KINDS = (
    ("interval", rf"(?:{_A}\s*(?:points\s*)?)?\[\s*{_A}\s*,\s*{_A}\s*\]"),
    ("pm", rf"{_A}\s*±\s*{_A}"),
    ("range", rf"{_A}(?:-(?!>)|–|\.\.){_A}"),       # "from a to b" is two numbers, each accounted for alone
    ("single", _A),
)
_MENTION = re.compile("|".join(f"(?P<{k}>{p})" for k, p in _KINDS))
_ONE = re.compile(_A)
_PARTS = re.compile(r"^([+\-−±]?)(\d+)(?:\.(\d+))?(?:e([+\-−]?\d+))?\s?(%|x|×|k|m|M)?$")
_SCALE = {"k": 1e3, "m": 1e6, "M": 1e6}

# Digits that are no measurement, each kind named (the rule is reported by ``audit``).
RULES: tuple[tuple[str, str], ...] = (
    ("code span", r"`[^`]*`"),                                      # commands, paths, config values
    ("date or time", r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}:\d{2}(?::\d{2})?\b"),
    ("commit hash", r"(?:(?<=commit )|(?<=commits ))[0-9a-f]{7,40}\b"),
    ("reference", r"(?:§|#|\b(?:Figure|Table|Section|Proposition|Lemma|Equation|issue|Issue)\s+#?)\d+(?:\.\d+)?"),
    ("name", r"\b[A-Za-z][A-Za-z_]*-?\d[\w.]*\w|\b[A-Za-z][A-Za-z_]*-?\d\b"),   # AVX2, AVX-512, v6, seed-0, log2
)
_RULES = [(name, re.compile(p)) for name, p in RULES]


@dataclass(frozen=True)
class Num:
    """One number as displayed: its value (units k/M applied, % and x kept as the number) and the step of its last
    shown digit (0.1 for "29.3", 1 for "94 %", 1000 for "296k")."""

    value: float
    step: float

    def shows(self, x: float) -> bool:
        """Whether ``x`` displayed at this number's precision is this number (ties at the half step accepted)."""
        return abs(x - self.value) <= self.step / 2 + 1e-9 * max(1.0, abs(x))


def parse_num(s: str) -> Num:
    m = _PARTS.match(s.strip())
    assert m, f"not a number: {s!r}"
    sign, whole, frac, exp, unit = m.groups()
    # an exponent beyond a float's range (a commit hash such as 9e61921 read as a number) is infinitely large or
    # small, a value no table shows: the audit then reports it unless a rule or a code span accounts for it
    e = int(exp.replace("−", "-")) if exp else 0
    if abs(e) > 300:
        return Num(math.inf if e > 0 else 0.0, 0.0)
    scale = _SCALE.get(unit or "", 1.0) * (10.0 ** e if e else 1.0)
    v = float(f"{whole}.{frac}" if frac else whole) * scale
    return Num(-v if sign in ("-", "−") else v, 10.0 ** -(len(frac) if frac else 0) * scale)


@dataclass(frozen=True)
class Mention:
    """A number, or numbers written as one ("a ± b", "a [l, h]", "a-b", "1..20"), at [start, end) of cleaned text."""

    text: str
    kind: str                 # single, pm, interval, range, or the name of a RULE
    nums: tuple[Num, ...]
    start: int
    end: int


def clean(text: str) -> str:
    """Markdown emphasis dropped and each paragraph, bullet or heading on one line with its whitespace collapsed, so
    a phrase of the notes matches across line breaks."""
    blocks: list[list[str]] = []
    for line in text.replace("**", "").splitlines():
        if not line.strip():
            blocks.append([])
        elif not blocks or re.match(r"\s*(?:[-#|>]|\d+\.)\s", line) or line.startswith("#"):
            blocks.append([line])
        else:
            blocks[-1].append(line)
    return "\n".join(re.sub(r"\s+", " ", " ".join(b)).strip() for b in blocks if b)


def mentions(text: str) -> list[Mention]:
    """Every number of cleaned ``text``: first the RULES' spans (not measurements), then the numeric mentions."""
    work, found = list(text), []
    for name, rx in _RULES:
        for m in rx.finditer("".join(work)):
            found.append(Mention(m.group(), name, (), m.start(), m.end()))
            work[m.start():m.end()] = "_" * (m.end() - m.start())
    work = "".join(work)
    for m in _MENTION.finditer(work):
        nums = tuple(parse_num(a.group()) for a in _ONE.finditer(m.group()))
        kind = "metric k" if m.lastgroup == "single" and work[m.start() - 1:m.start()] == "@" else m.lastgroup
        found.append(Mention(m.group(), kind, nums, m.start(), m.end()))
    return sorted(found, key=lambda x: x.start)


# ------------------------------------------------------------------------------------------------------------
# the page: tables and generated text above the notes
# ------------------------------------------------------------------------------------------------------------
@dataclass
class Table:
    """A markdown table under its section heading; cells as written."""

    heading: str
    header: list[str]
    rows: list[list[str]]

    def col(self, name: str) -> int:
        hits = [i for i, h in enumerate(self.header) if h.startswith(name)]
        assert len(hits) == 1, f"{self.heading}: column {name!r} matches {len(hits)} of {self.header}"
        return hits[0]

    def row(self, label: str, **where: str) -> list[str]:
        """The row whose first cell is ``label`` (and whose columns named in ``where``, by the start of the header
        with _ for a space, hold those values)."""
        hits = [r for r in self.rows if r[0] == label
                and all(r[self.col(c.replace("_", " "))] == v for c, v in where.items())]
        assert len(hits) == 1, f"{self.heading}: row {label!r} {where or ''} matches {len(hits)} rows"
        return hits[0]

    def cell(self, row: str, col: str, **where: str) -> str:
        return self.row(row, **where)[self.col(col)]

    def nums(self, row: str, col: str, **where: str) -> list[float]:
        """The numbers of one cell: "+1.1 ± 0.9 (k=3)" -> [1.1, 0.9, 3]."""
        return [parse_num(a.group()).value for a in _ONE.finditer(self.cell(row, col, **where))]

    def num(self, row: str, col: str, **where: str) -> float:
        return self.nums(row, col, **where)[0]

    def column(self, col: str, rows: Sequence[str] | None = None) -> list[float]:
        """The first number of ``col`` in each of ``rows`` (default: every row)."""
        labels = [r[0] for r in self.rows] if rows is None else rows
        return [self.num(r, col) for r in labels]


@dataclass
class Page:
    """The generated part of a page: its tables and its generated prose (split into sentences)."""

    tables: list[Table]
    sentences: list[str] = field(default_factory=list)

    def table(self, heading: str, i: int = 0) -> Table:
        """The i-th table under the section whose heading starts with ``heading`` (without the #s)."""
        hits = [t for t in self.tables if t.heading.startswith(heading)]
        assert len(hits) > i, f"no table {i} under a heading {heading!r}: {[t.heading for t in self.tables]}"
        return hits[i]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def sentences(text: str) -> list[str]:
    return [s for line in clean(text).splitlines() for s in re.split(r"(?<=[.;:])\s+(?=[A-Z(*\[-])", line) if s]


def parse_page(generated: str) -> Page:
    """Tables (consecutive ``|`` lines under the last heading) and prose of the generated part; blockquotes are
    hand-written notes (e.g. "measured before ...") and no source."""
    page, heading, prose, lines = Page([]), "", [], generated.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
            prose.append("\n\n" + heading + ".\n\n")
        elif line.startswith("|"):
            block = []
            while i < len(lines) and lines[i].startswith("|"):
                block.append(_cells(lines[i]))
                i += 1
            page.tables.append(Table(heading, block[0], block[2:]))
            continue
        elif not line.startswith(">"):
            prose.append(line)
        i += 1
    page.sentences = [s for para in re.split(r"\n\s*\n", "\n".join(prose)) for s in sentences(para)]
    return page


def _units(page: Page) -> list[list[Num]]:
    """What one number, or one "a ± b" / "a [l, h]", must come from: a cell, a header or a generated sentence."""
    texts = [c for t in page.tables for r in [t.header] + t.rows for c in r] + page.sentences
    return [[n for m in mentions(clean(x)) for n in m.nums] for x in texts]


# ------------------------------------------------------------------------------------------------------------
# the notes' sources and the check
# ------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Derived:
    """(b): the numbers of ``phrase`` (in order) are ``compute(page)`` at their displayed precision."""

    phrase: str
    how: str
    compute: Callable[[Page], Sequence[float]]


@dataclass(frozen=True)
class Cited:
    """(c): the numbers of ``phrase`` come from ``source`` (the paper's table, the commit and command that measured
    them); the prose itself must say where, so it stays true after a rerun."""

    phrase: str
    source: str


Source = Derived | Cited


@dataclass(frozen=True)
class Finding:
    """How one mention of the notes is accounted for; ``why`` None: not at all (a stale or unsourced number)."""

    mention: Mention
    sentence: str
    why: str | None


def split(page: str, heading: str) -> tuple[str, str]:
    """(generated part, notes from ``heading`` on); notes "" when the page has none."""
    at = page.find("\n" + heading + "\n")
    return (page, "") if at < 0 else (page[:at + 1], page[at + 1:])


STALE_LINE = "> numbers below not matching the tables:"     # written under the notes' heading by ``mark``


def _without_stale_line(notes: str) -> str:
    return re.sub("\n" + re.escape(STALE_LINE) + r"[^\n]*\n\n?", "\n", notes)


def _in(n: Num, unit: Sequence[Num]) -> bool:
    """Whether ``n`` is one of ``unit``'s numbers shown at n's precision (from a number at least as precise)."""
    return any(n.shows(s.value) and s.step <= n.step * (1 + 1e-9) for s in unit)


def _notes_text(notes: str) -> str:
    return clean(_without_stale_line(notes))


def unused(notes: str, sources: Sequence[Source]) -> list[Source]:
    """Sources whose phrase is not in the notes exactly once (the prose was edited): the list has to follow."""
    text = _notes_text(notes)
    return [s for s in sources if text.count(s.phrase) != 1]


def audit(generated: str, notes: str, sources: Sequence[Source]) -> list[Finding]:
    """Every mention of ``notes`` and how it is accounted for. A derivation that no longer gives its phrase's numbers
    (or cannot be computed: a table not run yet) is one finding for the whole phrase, ``why`` None. Sources whose
    phrase is missing are skipped here (``unused`` lists them)."""
    page = parse_page(generated)
    units = _units(page)
    text = _notes_text(notes)
    sents = [(m.start(), m.end()) for m in re.finditer(r"[^\n]+?(?:[.!?](?=\s)|(?=\n)|$)", text)]
    ms = mentions(text)

    def sentence(pos: int) -> str:
        return next((text[a:b].strip() for a, b in sents if a <= pos < b), text[max(0, pos - 60):pos + 60])

    claimed: dict[int, str | None] = {}      # mention start -> why (None: inside a failed derivation, reported once)
    out = []
    for src in sources:
        if text.count(src.phrase) != 1:
            continue
        at = text.find(src.phrase)
        inside = [m for m in ms if at <= m.start and m.end <= at + len(src.phrase) and m.nums]
        if isinstance(src, Cited):
            for m in inside:
                claimed[m.start] = f"cited: {src.source}"
            continue
        nums = [n for m in inside if m.kind != "metric k" for n in m.nums]   # pass@64 names the cell
        try:
            got, said = list(src.compute(page)), None
        except (AssertionError, IndexError, KeyError, ValueError, ZeroDivisionError) as e:   # a table not run yet
            got, said = [], f"cannot be computed from these tables ({type(e).__name__}: {e})"
        ok = said is None and len(got) == len(nums) and all(n.shows(x) for n, x in zip(nums, got))
        for m in inside:
            claimed[m.start] = f"derived: {src.how}" if ok else None
        if not ok:
            said = said or f"gives {', '.join(f'{x:.4g}' for x in got)}"
            out.append(Finding(Mention(src.phrase, "derived", tuple(nums), at, at + len(src.phrase)),
                               f"{sentence(at)} [{src.how}: {said}]", None))
    for m in ms:
        if m.start in claimed:
            if claimed[m.start] is None:
                continue
            why = claimed[m.start]
        elif not m.nums:
            why = f"rule: {m.kind}"
        elif m.kind in ("pm", "interval"):
            why = "on the page (one cell)" if any(all(_in(n, u) for n in m.nums) for u in units) else None
        else:
            why = "on the page" if all(any(_in(n, u) for u in units) for n in m.nums) else None
        out.append(Finding(m, sentence(m.start), why))
    return sorted(out, key=lambda f: f.mention.start)


def stale(generated: str, notes: str, sources: Sequence[Source]) -> list[Finding]:
    """The findings of ``audit`` that nothing accounts for."""
    return [f for f in audit(generated, notes, sources) if f.why is None]


def report(found: Sequence[Finding]) -> str:
    return "\n".join(f"  {f.mention.text!r} in: {f.sentence}" for f in found)


def warning(found: Sequence[Finding], *, doc: object, heading: str, sources_in: str) -> str:
    """What a page writer prints when ``mark`` found stale numbers."""
    return (f"warning: {len(found)} numbers of the notes of {doc} match none of the new tables (marked under "
            f"{heading!r}; rewrite them from the tables, or fix NOTES_SOURCES in {sources_in}):\n{report(found)}")


def mark(page: str, heading: str, sources: Sequence[Source]) -> tuple[str, list[Finding]]:
    """The page with one ``STALE_LINE`` under the notes' heading listing what ``stale`` finds (none: no line; an
    earlier line is replaced), and the findings."""
    generated, notes = split(page, heading)
    if not notes:
        return page, []
    notes = _without_stale_line(notes)
    found = stale(generated, notes, sources)
    if found:
        head, rest = notes.split("\n", 1) if "\n" in notes else (notes, "")
        listed = "; ".join(dict.fromkeys(f.mention.text for f in found))
        fix = "(rewrite them from the tables, or fix their NOTES_SOURCES entry)"
        notes = f"{head}\n\n{STALE_LINE} {listed} {fix}\n" + rest
    return generated + notes, found

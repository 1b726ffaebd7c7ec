"""LiveCodeBench's ``v6`` is one problem set whatever the source form, its window and prompt recorded and pinned.

Fixtures (tests/fixtures/lcb, make_fixtures.py): test6.jsonl holds three problems dated 2025-02-15..2025-03-08 and
one dated 2025-01-26, before v6's window; test5.jsonl one of 2024-11-02; test.jsonl one of 2023-06-10.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scoring.benchmarks import get_benchmark
from scoring.benchmarks import livecodebench as lcb
from scoring.templates import LCB_RUNNER_REVISION, SYSTEM_PROMPT, lcb_prompt

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lcb"
V6 = ["abc395_a", "abc396_b", "3488"]


def _ids(path, **kw):
    return [p.id for p in lcb.load(path, **kw)]


def _union(tmp_path: Path) -> Path:
    """Every fixture file in one, release order: a single-file copy of the whole dataset."""
    one = tmp_path / "union.jsonl"
    one.write_text("".join((FIXTURES / name).read_text() for name in lcb.RELEASES["release_v6"][0]))
    return one


def test_v6_is_the_same_problems_from_the_folder_and_from_test6(tmp_path):
    folder, single = lcb.load(FIXTURES), lcb.load(FIXTURES / "test6.jsonl")
    assert [p.id for p in folder] == [p.id for p in single] == V6   # was 4 from the folder, 3 from the file
    assert _ids(_union(tmp_path)) == V6                              # and from all six files in one
    assert lcb.selection_summary(folder) == lcb.selection_summary(single) == (
        "livecodebench release=v6: 3 problems (2025-02-15..2025-03-08); 1 row of test6.jsonl dated outside the "
        "release's window left out")
    assert [p.question for p in folder] == [p.question for p in single]


def test_every_tag_selects_the_same_problems_in_both_forms(tmp_path):
    """For every tag, the folder gives what one file holding the tag's own files gives; a file holding all six
    gives the same for every tag that ends at v6. It does not for earlier ends: the fixture's abc390_a sits in
    test6.jsonl but is dated inside v5's window (the dataset card says no real row does so)."""
    union = _union(tmp_path)
    for tag, (files, _, _) in lcb.RELEASES.items():
        own = tmp_path / f"{tag}.jsonl"
        own.write_text("".join((FIXTURES / name).read_text() for name in files))
        assert _ids(FIXTURES, release=tag) == _ids(own, release=tag), tag
        if tag.endswith("v6") or tag == "release_latest":
            assert _ids(FIXTURES, release=tag) == _ids(union, release=tag), tag
    assert (_ids(FIXTURES, release="v5"), _ids(union, release="v5")) == (["3301"], ["3301", "abc390_a"])
    assert len(_ids(FIXTURES, release="release_v6")) == 6
    assert _ids(FIXTURES, release="v5_v6") == ["3301", *V6, "abc390_a"]   # v5's window holds January 2025
    assert len(_ids(FIXTURES / "test6.jsonl", release=None)) == 4         # 'all': the file whole


def test_the_window_ends_are_both_inclusive(tmp_path):
    template = json.loads((FIXTURES / "test6.jsonl").read_text().splitlines()[0])
    f = tmp_path / "edges.jsonl"
    f.write_text("".join(json.dumps(dict(template, question_id=d, contest_date=f"{d}T00:00:00")) + "\n"
                         for d in ("2025-01-31", "2025-02-01", "2025-05-01", "2025-05-02")))
    assert _ids(f) == ["2025-02-01", "2025-05-01"]
    assert lcb.RELEASES["v6"] == (["test6.jsonl"], lcb.date(2025, 2, 1), lcb.date(2025, 5, 1))
    assert lcb.RELEASES["release_v5"][2] == lcb.date(2025, 1, 31) and lcb.RELEASES["v6"][1] == lcb.date(2025, 2, 1)


def test_every_result_line_records_the_definition():
    """``describe`` is what eval.run keeps in each result line's settings["data"] (eval.inputs.data_settings)."""
    from eval.inputs import data_settings
    bench = get_benchmark("livecodebench")
    for path in (FIXTURES, FIXTURES / "test6.jsonl"):
        data = data_settings(bench, lcb.load(path), path, {"release": "v6"})
        assert data["definition"] == {
            "release": "v6", "files": ["test6.jsonl"],
            "window": {"from": "2025-02-01", "to": "2025-05-01", "ends": "both inclusive, on the contest's calendar date",
                       "source": "v6 2025-02-01..2025-05-01: Kwai-Klear/KlearReasoner@3422f6d:README.md 'v6 "
                                 "(2025/02/01-2025/05/01)' = Qwen3-2507 cards 'LiveCodeBench v6 (25.02-25.05)'; other "
                                 "ends: the dataset card's months"}}, path
        assert data["outside_window"] == {"test6.jsonl": 1} and data["problems"] == 3
        assert sorted(data["files"]) == ["test6.jsonl"]
    one = data_settings(bench, lcb.load(FIXTURES), FIXTURES, {"release": "v6"})
    assert one["sha256"] == data["sha256"]   # the same problems: the same fingerprint, so either form resumes the other
    assert lcb.definition(None) == {"release": "all", "files": "every file given", "window": None}
    assert bench.version == "livecodebench-3"


def test_the_prompt_is_lcb_runner_at_one_revision():
    """lcb_runner@28fef95 ``PromptConstants.SYSTEM_MESSAGE_GENERIC`` and ``get_generic_question_template_answer``
    (compared byte for byte against that file when this was written; the clone does not hold it)."""
    assert LCB_RUNNER_REVISION == "LiveCodeBench/LiveCodeBench@28fef95ea8c9f7a547c8329f2cd3d32b92c1fa24"
    assert SYSTEM_PROMPT == ("You are an expert Python programmer. You will be given a question (problem "
                             "specification) and will generate a correct Python program that matches the "
                             "specification and passes all tests.")   # the older revisions' last sentence is gone
    p = {q.id: q for q in lcb.load(FIXTURES)}["abc396_b"]
    assert lcb_prompt(p.question) == (
        f"{SYSTEM_PROMPT}\n\n### Question:\nGiven N integers, print their average with exactly six digits after "
        "the decimal point.\n\n### Format: Read the inputs from stdin solve the problem and write the answer to stdout "
        "(do not directly test on the sample inputs). Enclose your code within delimiters as follows. Ensure that "
        "when the python program runs, it reads the inputs, runs the algorithm and writes output to STDOUT.\n"
        "```python\n# YOUR CODE HERE\n```\n\n### Answer: (use the provided format with backticks)\n\n")

    class ChatTokenizer:   # the chat template's messages: the system turn, then the user turn
        chat_template = "x"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            return json.dumps(messages)

    assert json.loads(lcb_prompt(p.question, ChatTokenizer())) == [
        {"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": p.question}]


def test_an_unknown_tag_is_refused():
    with pytest.raises(ValueError, match="unknown LiveCodeBench release 'v7'"):
        lcb.load(FIXTURES, release="v7")

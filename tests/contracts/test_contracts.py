"""The shared homes in contracts/: typed configs, the settings check, atomic writes, the k-grid, JSONL."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from typing import Literal, Optional

import numpy as np
import pytest

from contracts import config as cc
from contracts.files import append_jsonl, atomic_path, atomic_write_json, atomic_write_jsonl, atomic_write_text
from contracts.jsonl import read_jsonl, read_rows
from contracts.passk import k_grid, pass_at_k, passk_matrix, summarize
from contracts.settings import SettingsMismatch, check_settings, claim_folder, settings_diff

Engine = Literal["hf", "vllm", "auto"]


@dataclass
class Toy:
    engine: Engine = "auto"
    n: int = 4
    temperature: float = 1.0
    top_k: Optional[int] = None
    benchmarks: list = field(default_factory=list)
    verbose: bool = False
    mode: Optional[Literal["fast", "exact"]] = None


def test_choices_come_from_the_literal_type():
    assert cc.choices(Toy, "engine") == ("hf", "vllm", "auto")
    assert cc.choices(Toy, "mode") == ("fast", "exact")
    with pytest.raises(ValueError, match="not a choice field"):
        cc.choices(Toy, "n")


def test_overrides_are_coerced_to_the_declared_types():
    cfg = cc.load(Toy, None, ["engine=vllm", "n=8", "temperature=0", "top_k=20", "benchmarks=aime24,aime25",
                              "verbose=yes", "mode=null"])
    assert cfg == Toy(engine="vllm", n=8, temperature=0.0, top_k=20, benchmarks=["aime24", "aime25"], verbose=True)
    assert isinstance(cfg.temperature, float)
    assert cc.load(Toy, None, ["benchmarks=[math500]", "top_k=none"]).benchmarks == ["math500"]


def test_bad_choice_names_the_field_the_choices_and_a_close_match():
    with pytest.raises(cc.ConfigError) as e:
        cc.load(Toy, None, ["engine=vlm"])
    assert str(e.value) == "config field 'engine' must be one of hf, vllm, auto; got 'vlm' (did you mean 'vllm'?)"
    with pytest.raises(cc.ConfigError, match="'n' expects int, got 'four'"):
        cc.load(Toy, None, ["n=four"])
    with pytest.raises(cc.ConfigError, match=r"unknown config key\(s\) 'temprature' \(did you mean 'temperature'\?\)"):
        cc.load(Toy, None, ["temprature=0.6"])
    with pytest.raises(cc.ConfigError, match="must look like key=value"):
        cc.parse_overrides(["engine"])


def test_a_preset_file_then_overrides_and_its_errors_name_the_file(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("engine: hf\nn: 2\n")
    assert cc.load(Toy, preset, ["n=3"]) == Toy(engine="hf", n=3)
    (tmp_path / "bad.yaml").write_text("engine: [hf\n")
    with pytest.raises(cc.ConfigError, match="bad.yaml: not valid YAML"):
        cc.load(Toy, tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- engine\n")
    with pytest.raises(cc.ConfigError, match="list.yaml: a preset is a flat mapping"):
        cc.load(Toy, tmp_path / "list.yaml")
    (tmp_path / "typo.yaml").write_text("engine: gpu\n")
    with pytest.raises(cc.ConfigError, match=r"typo.yaml: config field 'engine' must be one of"):
        cc.load(Toy, tmp_path / "typo.yaml")
    with pytest.raises(cc.ConfigError, match="does not exist"):
        cc.load(Toy, tmp_path / "missing.yaml")


def test_dump_yaml_round_trips(tmp_path):
    cfg = Toy(engine="hf", n=16, benchmarks=["aime24"], top_k=20)
    cc.dump_yaml(cfg, tmp_path / "c.yaml")
    assert cc.load(Toy, tmp_path / "c.yaml") == cfg
    assert [p.name for p in tmp_path.iterdir()] == ["c.yaml"]   # no temporary left behind


def test_settings_diff_names_each_field_with_both_values():
    have = {"n": 4, "temperature": 0.6, "betas": [0.9, 0.99]}
    want = {"n": 8, "temperature": 0.6, "betas": (0.9, 0.99), "top_k": 20}
    assert settings_diff(have, want) == [("n", 4, 8), ("top_k", None, 20)]
    assert settings_diff(have, want, defaults={"top_k": 20}) == [("n", 4, 8)]   # a field added later: its default
    assert settings_diff(have, want, keys=["temperature", "betas"]) == []       # tuples equal lists
    with pytest.raises(SettingsMismatch, match=r"^out was written with other settings \(n: recorded 4, now 8\); "
                                               r"use another --out$"):
        check_settings(have, want, ["n"], where="out", fix="use another --out")


def test_claim_folder_creates_checks_and_never_touches_a_foreign_folder(tmp_path):
    out = tmp_path / "out"
    assert claim_folder(out, "owner.json", {"n": 4}, owner="the demo", fix="rerun with --fresh") is True
    assert json.loads((out / "owner.json").read_text()) == {"n": 4}
    assert claim_folder(out, "owner.json", {"n": 4}, owner="the demo", fix="rerun with --fresh") is False
    with pytest.raises(SettingsMismatch, match=r"n: recorded 4, now 5\); rerun with --fresh"):
        claim_folder(out, "owner.json", {"n": 5}, owner="the demo", fix="rerun with --fresh")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(SettingsMismatch, match="not written by the demo"):
        claim_folder(foreign, "owner.json", {"n": 4}, owner="the demo", fix="")
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]


def test_atomic_writes_leave_the_old_file_when_the_writer_fails(tmp_path):
    path = tmp_path / "f.json"
    atomic_write_json(path, {"a": 1})
    with pytest.raises(RuntimeError):
        with atomic_path(path) as tmp:
            tmp.write_text('{"a": ')   # half a file
            raise RuntimeError("killed mid-write")
    assert json.loads(path.read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]
    atomic_write_text(tmp_path / "sub" / "t.txt", "x")
    assert (tmp_path / "sub" / "t.txt").read_text() == "x"
    atomic_write_jsonl(tmp_path / "r.jsonl", [{"i": 0}, {"i": 1}])
    append_jsonl(tmp_path / "r.jsonl", {"i": 2})
    assert [r["i"] for r in read_jsonl(tmp_path / "r.jsonl")] == [0, 1, 2]


def test_read_jsonl_names_the_file_and_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"a": 1}\n\n{"a": \n')
    with pytest.raises(ValueError, match=r"d.jsonl:3: malformed JSON line"):
        read_jsonl(path)


def test_atomic_write_jsonl_writes_one_compact_line_per_row(tmp_path):
    # the one JSONL writer (the task data files of `python -m scoring.tasks.make` and the demos go through it too)
    path = atomic_write_jsonl(tmp_path / "d" / "rows.jsonl", [{"id": "a-0", "prompt": "1+2=", "answer": 3},
                                                              {"x": "×"}])
    assert path == tmp_path / "d" / "rows.jsonl"
    assert path.read_bytes() == b'{"id": "a-0", "prompt": "1+2=", "answer": 3}\n{"x": "\xc3\x97"}\n'
    assert sorted(p.name for p in path.parent.iterdir()) == ["rows.jsonl"]   # no temporary file left


def test_read_rows_takes_json_lines_or_an_array_and_says_where_each_row_is(tmp_path):
    lines = tmp_path / "p.jsonl"
    lines.write_text('{"id": 1}\n\n{"id": 2}\n')
    assert read_rows(lines) == [(f"{lines}:1", 1, {"id": 1}), (f"{lines}:3", 3, {"id": 2})]   # blank lines count
    packed = tmp_path / "p.jsonl.gz"
    packed.write_bytes(gzip.compress(b'{"id": 1}\n'))
    assert read_rows(packed) == [(f"{packed}:1", 1, {"id": 1})]
    array = tmp_path / "p.json"
    array.write_text('\n  [{"id": 1},\n   {"id": 2}]\n')
    assert read_rows(array) == [(f"{array}[0]", 1, {"id": 1}), (f"{array}[1]", 2, {"id": 2})]
    assert [x.where for x in read_rows(array)] == [f"{array}[0]", f"{array}[1]"]


@pytest.mark.parametrize("name, text, message", [
    ("bad.jsonl", '{"id": 1}\n{"id": \n', "bad.jsonl:2: malformed JSON line (Expecting value at column 1)"),
    ("str.jsonl", '{"id": 1}\n"x"\n', "str.jsonl:2: expected a JSON object, got str"),
    ("bad.json", '[{"id": 1},\n {"id": }]', "bad.json:2: malformed JSON (Expecting value at column 9)"),
    ("int.json", '[{"id": 1}, 3]', "int.json[1]: expected a JSON array of objects, got int"),
], ids=["jsonl-malformed", "jsonl-not-object", "array-malformed", "array-not-object"])
def test_read_rows_errors_name_the_file_and_line(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        read_rows(path)
    assert str(err.value) == f"{tmp_path}/{message}"
    with pytest.raises(FileNotFoundError, match=f"^problems file {tmp_path}/none.jsonl does not exist$"):
        read_rows(tmp_path / "none.jsonl", what="problems file")


def test_one_k_grid_for_every_pass_at_k_table():
    assert k_grid(1) == [1]
    assert k_grid(32) == [1, 2, 4, 8, 16, 32]
    assert k_grid(6) == [1, 2, 4, 6]
    assert k_grid(6, with_n=False) == [1, 2, 4]
    n, c = np.array([6, 6, 6]), np.array([0, 1, 6])
    assert passk_matrix(n, c).shape == (3, len(k_grid(6)))   # one column per k of the grid
    assert passk_matrix(n, c)[:, -1].tolist() == [0.0, 1.0, 1.0]
    table = summarize(n, c)
    assert sorted(table["pass"]) == k_grid(6)
    assert table["pass"][6][0] == pytest.approx(2 / 3)
    assert table["pass"][2][0] == pytest.approx(float(pass_at_k(n, c, 2).mean()))
    assert table["avg"] == pytest.approx((0 + 1 / 6 + 1) / 3)


def test_sample_readers_key_rows_by_problem_and_sample_and_say_which_lines_they_drop(tmp_path):
    from contracts.samples import read_samples, repair

    def row(pid, correct, **extra):
        return json.dumps({"problem_id": pid, "correct": correct, **extra}) + "\n"

    path = tmp_path / "addition.jsonl"
    # two writers appended p0 and p1 twice (lines 3 and 5), the second draws differing from the first
    text = row("p0", [True, True]) + row("p1", [False, True]) + row("p0", [False, False]) + row("p2", [True, False]) \
        + row("p1", [False, False])
    path.write_text(text)
    said = []
    rows = read_samples(path, warn=said.append)
    assert [(r["problem_id"], r["correct"]) for r in rows] == [("p0", [True, True]), ("p1", [False, True]),
                                                               ("p2", [True, False])]   # each problem's first line
    assert said == [f"{path}: 2 duplicate rows of problems already in the file, dropped (each problem counts once, "
                    f"from its first line): problem 'p0' at line 3, first at line 1 and 1 more (lines 5); two writers "
                    f"appended the same problems; the next eval.run of this model and benchmark on this folder "
                    f"removes them from the file"]
    assert path.read_text() == text   # a reader never modifies the file
    # a file of one row per sample (the disagreements file): the key is (problem, sample)
    dis = tmp_path / "addition.disagreements.jsonl"
    dis.write_text(row("p0", True, sample=0) + row("p0", False, sample=1) + row("p0", True, sample=0))
    said.clear()
    assert [(r["problem_id"], r["sample"]) for r in read_samples(dis, warn=said.append)] == [("p0", 0), ("p0", 1)]
    assert len(said) == 1 and "problem 'p0' sample 0 at line 3, first at line 1;" in said[0]
    # the writer's repair (under the file's lock) removes them from the file, and a clean file says nothing
    said.clear()
    assert repair(path, warn=said.append) == rows
    assert path.read_text() == row("p0", [True, True]) + row("p1", [False, True]) + row("p2", [True, False])
    assert len(said) == 1 and said[0].endswith("two writers appended the same problems; removed from the file")
    said.clear()
    assert read_samples(path, warn=said.append) == rows and repair(path, warn=said.append) == rows and said == []

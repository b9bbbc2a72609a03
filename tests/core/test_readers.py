"""Finding steps under input paths and reading them in batch order (CONTRACT section 1)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from pipeline.errors import StepError
from pipeline.io import jsonl
from pipeline.io.discovery import find_sources
from pipeline.io.load import group_steps, load_step
from tests.support.samples import sample, table, write_step


def test_steps_from_file_names_folders_and_the_step_column(tmp_path: Path) -> None:
    root = tmp_path / "in"
    write_step(root, [sample(0)], step=2)
    write_step(root / "step=10", [sample(1)], step=10)
    (root / "step=10" / "step=10.parquet").rename(root / "step=10" / "part-b.parquet")
    write_step(root / "step=10", [sample(0)], step=10, fmt="jsonl")
    (root / "step=10" / "step=10.jsonl").rename(root / "step=10" / "part-a.jsonl")
    table([sample(5, step=3), sample(6, step=4), sample(7, step=3)]).write_parquet(
        root / "mixed.parquet"
    )
    (root / "README.txt").write_text("not a table")
    steps = group_steps(find_sources([root]))
    assert list(steps) == [2, 3, 4, 10]
    assert [s.path.name for s in steps[10]] == ["part-a.jsonl", "part-b.parquet"]
    step3 = load_step(3, steps[3]).frame
    assert step3.get_column("index").to_list() == [5, 7]
    step10 = load_step(10, steps[10]).frame
    assert step10.get_column("index").to_list() == [0, 1]


def test_leaf_numbered_in_order_of_appearance_when_absent(tmp_path: Path) -> None:
    rows = [sample(i) for i in (4, 5, 4, 4)]
    for row in rows:
        del row["leaf"]
    write_step(tmp_path, rows)
    frame = load_step(1, group_steps(find_sources([tmp_path]))[1]).frame
    assert frame.get_column("leaf").to_list() == [0, 0, 1, 2]


def test_extra_columns_are_ignored_and_listed(tmp_path: Path) -> None:
    write_step(tmp_path, [sample(0, judge="ok", latency=1.5)])
    loaded = load_step(1, group_steps(find_sources([tmp_path]))[1])
    assert loaded.ignored_columns == ["judge", "latency"]
    assert "judge" not in loaded.frame.columns
    assert loaded.files[0]["rows"] == 1 and len(loaded.files[0]["sha256"]) == 64


def test_a_table_without_step_in_name_or_column_is_refused(tmp_path: Path) -> None:
    table([sample(0)]).write_parquet(tmp_path / "rollouts.parquet")
    with pytest.raises(StepError, match="no step in the file name"):
        group_steps(find_sources([tmp_path / "rollouts.parquet"]))


def test_types_are_conformed_to_the_contract(tmp_path: Path) -> None:
    write_step(tmp_path, [sample(0, loss_mask=[1, 0])], fmt="jsonl")
    frame = load_step(1, group_steps(find_sources([tmp_path]))[1]).frame
    assert frame.schema["tokens"] == pl.List(pl.Int32)
    assert frame.schema["loss_mask"] == pl.List(pl.Int8)
    assert frame.schema["response_length"] == pl.Int32
    assert frame.schema["leaf"] == pl.Int32
    assert frame.schema["reward"] == pl.Float64


def _jsonl(rows: list[dict], replace: dict[int, tuple[str, str]] | None = None) -> bytes:
    lines = [json.dumps(row) for row in rows]
    for k, (old, new) in (replace or {}).items():
        lines[k] = lines[k].replace(old, new)
    return "".join(line + "\n" for line in lines).encode()


CHAT = [{"role": "user", "content": "hi", "name": None}, {"role": "assistant", "content": "ok"}]


def test_a_clean_json_lines_file_stays_on_polars_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chat prompts, nested objects, nulls and keys with escapes repeat no key: no line is
    parsed again in Python."""
    rows = [
        sample(i, prompt=CHAT, metadata={"a": {"b": [{"c": None, "d": i}]}, 'k"q': 1})
        for i in range(4)
    ]

    def per_line(data: bytes) -> list[dict]:
        raise AssertionError("a clean file took the per-line path")

    monkeypatch.setattr(jsonl, "_json_objects", per_line)
    frame = jsonl.read_jsonl(_jsonl(rows))
    assert frame.height == 4


def test_a_key_given_twice_inside_an_array_is_that_row_s_duplicate_key(tmp_path: Path) -> None:
    rows = [sample(i, prompt=CHAT) for i in range(4)]
    path = tmp_path / "step=1.jsonl"
    path.write_bytes(_jsonl(rows, {2: ('"role": "user"', '"role": "user", "role": "system"')}))
    loaded = load_step(1, group_steps(find_sources([tmp_path]))[1])
    (violation,) = loaded.type_violations
    assert violation.rule == "duplicate_key"
    assert violation.rows == [(2, 0)]
    assert violation.message == (
        "key role inside prompt must appear once in each JSON object, but it is given twice "
        "at file row 3"
    )


def test_an_array_no_polars_type_holds_is_kept_as_its_json_text(tmp_path: Path) -> None:
    """`[1, {"d": 2}]` in metadata: Polars would turn the 1 into null; it is kept as text."""
    rows = [sample(i, metadata={"a": [1, {"d": 2}]}) for i in range(4)]
    (tmp_path / "step=1.jsonl").write_bytes(_jsonl(rows))
    frame = load_step(1, group_steps(find_sources([tmp_path]))[1]).frame
    assert frame.get_column("metadata").to_list() == ['{"a":[1,{"d":2}]}'] * 4

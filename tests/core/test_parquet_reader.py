"""The Parquet reader: the split read (list columns decoded on threads of their own) gives
the table a plain read gives; a small file is read plainly; a damaged one is named."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from pipeline.errors import StepError
from pipeline.io import parquet
from pipeline.io.load import read_table
from tests.support.samples import generated_step


@pytest.fixture(scope="module")
def step_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A step from bench/generate.py, large enough for the split read."""
    return generated_step(tmp_path_factory.mktemp("parquet")) / "step=0.parquet"


def test_the_split_read_equals_a_plain_read(step_file: Path) -> None:
    assert step_file.stat().st_size >= parquet.SPLIT_READ_BYTES  # the read that splits
    got = read_table(step_file)
    assert got.columns == pl.read_parquet_schema(step_file).names()
    assert got.equals(pl.read_parquet(step_file))


def test_a_small_parquet_file_is_read_plainly(
    step_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "step=0.parquet"
    pl.read_parquet(step_file).head(64).write_parquet(path)
    assert path.stat().st_size < parquet.SPLIT_READ_BYTES

    mapped: list[object] = []

    def counted(function: object, groups: object) -> object:
        mapped.append(groups)
        return map(function, groups)  # type: ignore[call-overload]

    assert parquet.read_parquet(path.read_bytes(), counted).equals(pl.read_parquet(path))
    assert mapped == []  # no column group was read apart
    big = step_file.read_bytes()
    assert parquet.read_parquet(big, counted).equals(pl.read_parquet(step_file))
    assert len(mapped) == 1


def test_a_damaged_parquet_file_is_reported_as_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "step=0.parquet"
    path.write_bytes(b"PAR1 not really parquet PAR1")
    with pytest.raises(StepError) as error:
        read_table(path, 0)
    assert error.value.violations[0].rule == "unreadable_file"

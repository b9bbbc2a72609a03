"""The decoder behind test_shard_bytes' version-independent digests reads what the file
holds: its levels give back the lists' lengths, and a changed value changes the digest."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from pipeline.io.writer import PARQUET_OPTIONS
from tests.support.parquet_pages import decoded, decoded_digest

LISTS = [[1, 2, 3], [], [4], None, [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]] * 300


def _written(path: Path, lists: list[list[int] | None]) -> Path:
    frame = pl.DataFrame({"row": range(len(lists)), "tokens": lists})
    frame = frame.with_columns(pl.col("tokens").cast(pl.List(pl.Int32)))
    frame.write_parquet(path, **PARQUET_OPTIONS)
    return path


def test_the_levels_give_back_the_list_lengths(tmp_path: Path) -> None:
    _footer, pages = decoded(_written(tmp_path / "a.parquet", LISTS))
    token_pages = [p for p in pages if p[0] == "tokens.list.element" and p[2]]
    repetition = [level for page in token_pages for level in page[2]]
    definition = [level for page in token_pages for level in page[3]]
    assert repetition.count(0) == len(LISTS)
    # Each row starts at a 0 repetition level; an empty or null list is one entry whose
    # definition level stops short of the element.
    starts = [i for i, level in enumerate(repetition) if level == 0] + [len(repetition)]
    entries = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert entries == [max(len(row or []), 1) for row in LISTS]
    leaf = max(definition)
    assert sum(level == leaf for level in definition) == sum(len(row or []) for row in LISTS)


def test_a_changed_value_changes_the_digest(tmp_path: Path) -> None:
    changed = [*LISTS[:-1], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 16]]
    same = decoded_digest(_written(tmp_path / "a.parquet", LISTS))
    assert decoded_digest(_written(tmp_path / "b.parquet", LISTS)) == same
    assert decoded_digest(_written(tmp_path / "c.parquet", changed)) != same

"""Parity of two payloads: read both sides (two builds or two inputs), compare, report."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from pipeline import columns as c
from pipeline.errors import UsageError
from pipeline.io.storage import ObjectRoot, root_of
from pipeline.parity import store
from pipeline.parity.compare import EXAMPLES, compare_frames
from pipeline.parity.report import ParityReport
from pipeline.parity.sources import is_build, one_table, read_build, read_inputs

BUILD_KEYS: tuple[str, ...] = (c.STEP, c.BATCH_POSITION)
INPUT_KEYS: tuple[str, ...] = (c.STEP, c.INDEX, c.LEAF)


def _is_build(path: Path | ObjectRoot) -> bool:
    return store.is_build(path) if isinstance(path, ObjectRoot) else is_build(path)


def _read_build(path: Path | ObjectRoot, notes: list[str]) -> pl.DataFrame:
    return store.read_build(path) if isinstance(path, ObjectRoot) else read_build(path, notes)


def _input(path: Path | ObjectRoot) -> Path | str:
    """An input root as discovery takes it (an object store's by its URL)."""
    return path.uri if isinstance(path, ObjectRoot) else path


def parity(a: str | Path, b: str | Path, limit: int = EXAMPLES) -> ParityReport:
    """Compare two builds, or two sample-table inputs; mixing the two is a usage error."""
    left_path, right_path = root_of(str(a)), root_of(str(b))
    for path in (left_path, right_path):
        if isinstance(path, Path) and not path.exists():
            raise UsageError(f"{path} does not exist")
    kinds = [_is_build(left_path), _is_build(right_path)]
    if kinds[0] != kinds[1]:
        build, other = (left_path, right_path) if kinds[0] else (right_path, left_path)
        raise UsageError(
            f"cannot compare a build ({build}) with sample-table inputs ({other}); "
            "give two output roots or step folders, or two inputs"
        )
    notes: list[str] = []
    if kinds[0]:
        mode, keys = "builds", BUILD_KEYS
        left, right = _read_build(left_path, notes), _read_build(right_path, notes)
    else:
        mode, keys = "inputs", INPUT_KEYS
        left_steps, left_ignored = read_inputs(_input(left_path), notes)
        right_steps, right_ignored = read_inputs(_input(right_path), notes)
        left, right = one_table([left_steps, right_steps], notes)
        if left_ignored or right_ignored:
            notes.append(
                "columns the pipeline ignores, not compared: left "
                f"{', '.join(left_ignored) or '-'}; right {', '.join(right_ignored) or '-'}"
            )
    # An input column the contract allows to be null reads as nulls when absent.
    nullable = c.INPUT_SCHEMA if mode == "inputs" else None
    columns, rows = compare_frames(left, right, keys, limit, nullable)
    return ParityReport(
        mode=mode,
        keys=keys,
        left=str(left_path),
        right=str(right_path),
        rows_left=left.height,
        rows_right=right.height,
        only_left=rows["only_left"],
        only_right=rows["only_right"],
        row_examples=rows["examples"],
        columns=columns,
        notes=notes,
    )

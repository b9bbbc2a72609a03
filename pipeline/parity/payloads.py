"""Parity of two payloads: read both sides (two builds or two inputs), compare, report."""

from __future__ import annotations

from pathlib import Path

from pipeline import columns as c
from pipeline.errors import UsageError
from pipeline.parity.compare import EXAMPLES, compare_frames
from pipeline.parity.report import ParityReport
from pipeline.parity.sources import is_build, one_table, read_build, read_inputs

BUILD_KEYS: tuple[str, ...] = (c.STEP, c.BATCH_POSITION)
INPUT_KEYS: tuple[str, ...] = (c.STEP, c.INDEX, c.LEAF)


def parity(a: str | Path, b: str | Path, limit: int = EXAMPLES) -> ParityReport:
    """Compare two builds, or two sample-table inputs; mixing the two is a usage error."""
    left_path, right_path = Path(a), Path(b)
    for path in (left_path, right_path):
        if not path.exists():
            raise UsageError(f"{path} does not exist")
    kinds = [is_build(left_path), is_build(right_path)]
    if kinds[0] != kinds[1]:
        build, other = (left_path, right_path) if kinds[0] else (right_path, left_path)
        raise UsageError(
            f"cannot compare a build ({build}) with sample-table inputs ({other}); "
            "give two output roots or step folders, or two inputs"
        )
    notes: list[str] = []
    if kinds[0]:
        mode, keys = "builds", BUILD_KEYS
        left, right = read_build(left_path, notes), read_build(right_path, notes)
    else:
        mode, keys = "inputs", INPUT_KEYS
        left_steps, left_ignored = read_inputs(left_path, notes)
        right_steps, right_ignored = read_inputs(right_path, notes)
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

"""The parity report: what `compare_frames` found, as text for people and JSON for tools."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from pipeline.parity.compare import PREVIEW, ColumnDiff


@dataclass
class ParityReport:
    mode: str  # "builds" or "inputs"
    keys: tuple[str, ...]
    left: str
    right: str
    rows_left: int
    rows_right: int
    only_left: int
    only_right: int
    row_examples: list[dict[str, Any]]  # {"side", "key"}
    columns: list[ColumnDiff]
    notes: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.columns and not self.only_left and not self.only_right

    def summary(self) -> str:
        if self.identical:
            return "identical"
        one_sided = self.only_left + self.only_right
        rows = f", {one_sided} rows on one side only" if one_sided else ""
        return f"{len(self.columns)} columns differ{rows}"

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = _jsonable(
            {
                "mode": self.mode,
                "keys": list(self.keys),
                "left": self.left,
                "right": self.right,
                "rows": {
                    "left": self.rows_left,
                    "right": self.rows_right,
                    "only_left": self.only_left,
                    "only_right": self.only_right,
                    "examples": self.row_examples,
                },
                "columns": [column.__dict__ for column in self.columns],
                "notes": self.notes,
                "identical": self.identical,
                "summary": self.summary(),
            }
        )
        return data

    def text(self) -> str:
        lines = [
            f"parity of {self.mode}: left {self.left} ({self.rows_left} rows), "
            f"right {self.right} ({self.rows_right} rows), keyed by ({', '.join(self.keys)})"
        ]
        lines += [f"note: {note}" for note in self.notes]
        if self.only_left or self.only_right:
            lines.append(f"rows: {self.only_left} only in left, {self.only_right} only in right")
            lines += [f"  only in {ex['side']}: {_show_key(ex['key'])}" for ex in self.row_examples]
            lines += _unlisted(self.only_left + self.only_right, len(self.row_examples))
        matched = self.rows_left - self.only_left
        for column in self.columns:
            lines.append(_column_header(column, matched))
            lines += [f"  {_show_example(column, ex)}" for ex in column.examples]
            if column.examples:
                lines += _unlisted(column.rows, len(column.examples))
        lines.append(self.summary())
        return "\n".join(lines)


def _unlisted(total: int, listed: int) -> list[str]:
    """The line counting what the examples above leave out (`--format json` has the counts)."""
    return [f"  and {total - listed} more"] if total > listed else []


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_show(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _show_key(key: dict[str, Any]) -> str:
    return ", ".join(f"{name} {_show(value)}" for name, value in key.items())


def _show_side(example: dict[str, Any], side: str) -> str:
    if side not in example:
        return f"{side} (absent)"
    text = f"{side} {_show(example[side])}"
    if side + "_bits" in example:
        text += f" ({example[side + '_bits']})"
    length = example.get(side + "_length")
    if length is not None and "element" not in example and length > PREVIEW:
        text = text[:-1] + f", ...] (length {length})"
    return text


def _show_example(column: ColumnDiff, example: dict[str, Any]) -> str:
    where = _show_key(example["key"])
    if "element" in example:
        where += (
            f", element {example['element']} (lengths {example['left_length']}"
            f" and {example['right_length']})"
        )
    return f"{where}: {_show_side(example, 'left')}, {_show_side(example, 'right')}"


def _column_header(column: ColumnDiff, matched: int) -> str:
    if column.kind == "only_left":
        return f"column {column.column}: only in left ({column.rows} rows)"
    if column.kind == "only_right":
        return f"column {column.column}: only in right ({column.rows} rows)"
    if column.kind in ("absent_left", "absent_right"):
        side = column.kind.removeprefix("absent_")
        return (
            f"column {column.column}: absent in {side} (read as null), "
            f"{column.rows} of {matched} rows differ"
        )
    if column.kind == "type":
        return (
            f"column {column.column}: type differs, left {column.left_type}, right "
            f"{column.right_type} ({column.rows} rows)"
        )
    return f"column {column.column}: {column.rows} of {matched} rows differ"


def _jsonable(value: Any) -> Any:
    """Plain JSON: non-finite floats as strings ("nan", "-inf")."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value

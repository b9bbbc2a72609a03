"""`validate --format json` and `parity --format json` print strict JSON (issue 31 item 8):
non-finite numbers as the strings "nan", "inf" and "-inf", decimals as their text."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from pipeline.cli import main
from pipeline.commands import strict_json
from pipeline.errors import Violation
from tests.conftest import sample, table


def strict_loads(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise AssertionError(f"bare {constant} in the JSON output")

    return json.loads(text, parse_constant=refuse)


def validate(inputs: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str]:
    status = main(["validate", str(inputs), "--global-batch-size", "4", *flags])
    return status, capsys.readouterr().out


def test_strict_json_values() -> None:
    violation = Violation(
        "column_type", "column index must be Int64", step=7, rows=[(Decimal("2.5"), 0)]
    )
    value = {
        "floats": [1.5, math.nan, math.inf, -math.inf],
        "decimals": [Decimal("2.5"), Decimal("NaN"), Decimal("-Infinity")],
        "violation": violation.__dict__,
    }

    assert strict_loads(strict_json(value)) == {
        "floats": [1.5, "nan", "inf", "-inf"],
        "decimals": ["2.5", "nan", "-inf"],
        "violation": {
            "rule": "column_type",
            "message": "column index must be Int64",
            "step": 7,
            "files": [],
            "rows": [["2.5", 0]],
            "n_rows": 0,
        },
    }


def test_a_nan_index_is_named_as_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [sample(i) for i in range(8)]
    rows[2]["index"] = math.nan
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "step=1.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))

    status, out = validate(folder, capsys, "--format", "json")

    (entry,) = strict_loads(out)
    assert status == 1
    assert entry["valid"] is False
    (violation,) = entry["violations"]
    assert violation["rule"] == "column_type"
    assert violation["rows"] == [["nan", 0]]


def test_a_decimal_index_gives_the_same_verdict_in_json_and_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    frame = table([sample(i) for i in range(8)]).with_columns(
        pl.Series("index", [Decimal(i) + Decimal("0.5") * (i == 2) for i in range(8)]).cast(
            pl.Decimal(10, 1)
        )
    )
    folder = tmp_path / "in"
    folder.mkdir()
    frame.write_parquet(folder / "step=1.parquet")

    status, out = validate(folder, capsys, "--format", "json")
    text_status = main(["validate", str(folder), "--global-batch-size", "4"])
    text = capsys.readouterr()

    (entry,) = strict_loads(out)
    assert status == text_status
    rules = sorted(v["rule"] for v in entry["violations"])
    assert rules == sorted(
        line.split(" rule ")[1].split(":")[0] for line in text.err.splitlines() if " rule " in line
    )
    assert entry["valid"] is (status == 0)

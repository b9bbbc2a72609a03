"""`validate --format json` and `parity --format json` print strict JSON:
non-finite numbers as the strings "nan", "inf" and "-inf", decimals as their text. The
commands on bad data (a NaN or Decimal index, non-finite rewards) are corpus cases
(tests/core/bad_inputs/generate.py); here, the encoder itself."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any

from pipeline.errors import Violation
from pipeline.json_text import strict_json


def strict_loads(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise AssertionError(f"bare {constant} in the JSON output")

    return json.loads(text, parse_constant=refuse)


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

"""JSON the commands print: what strict parsers accept."""

from __future__ import annotations

import json
import math
import numbers
from decimal import Decimal
from typing import Any


def strict_json(value: Any) -> str:
    """JSON that strict parsers accept: a non-finite number (a NaN index named in a
    violation, say) is the string "nan", "inf" or "-inf"; a Decimal is its text, which
    keeps every digit; any other value JSON has no type for is its text too."""
    return json.dumps(_jsonable(value), indent=2, allow_nan=False)


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, str | bool):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else _non_finite(number)
    if isinstance(value, Decimal):
        return str(value) if value.is_finite() else _non_finite(float(value))
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    return str(value)


def _non_finite(value: float) -> str:
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")

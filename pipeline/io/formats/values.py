"""The values a dump unpickled, as typed Polars columns: checked before Polars sees them.

The unpickled values are Python objects the file chose: before any reaches Polars (which
recurses into nested values without a limit) or `json`, its shape is checked, cycles are
refused, and what the columns would hold is charged to a budget bounded by the file's size
(a pickle can reference one list from every sample). A value that does not fit its column
is a `malformed_dump` naming the file, the field and the sample.
"""

from __future__ import annotations

import json
import reprlib
from collections.abc import Iterable
from itertools import chain
from pathlib import Path
from typing import Any

import polars as pl

from pipeline.errors import StepError, step_error
from pipeline.io.formats.declared import Malformed
from pipeline.io.formats.unpickle import Budget, first_sentence

_NONE = type(None)
LISTS = (list, tuple)
# Values Polars takes without looking inside; numpy scalars are leaves too.
_LEAVES = frozenset((int, float, bool, str, _NONE))
_NUMBERS = frozenset((int, float, bool, _NONE))

_PREVIEW = reprlib.Repr()
_PREVIEW.maxlevel = 3
_PREVIEW.maxlist = _PREVIEW.maxtuple = 8
_PREVIEW.maxdict = _PREVIEW.maxset = _PREVIEW.maxfrozenset = 4
_PREVIEW.maxstring = _PREVIEW.maxother = 60


def preview(value: Any) -> str:
    """A short repr that stops at nesting and cycles."""
    text = _PREVIEW.repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_leaf(kind: type, numeric: bool = False) -> bool:
    """A value Polars takes without looking inside. Where a number belongs a bool is not
    one: Polars would read True as 1."""
    if kind in _LEAVES:
        return not (numeric and kind is bool)
    import numpy as np

    if issubclass(kind, np.bool_):
        return not numeric
    return issubclass(kind, np.number)


def _what_belongs(numeric: bool) -> str:
    return "a number" if numeric else "a single value"


def plain_value(value: Any) -> Any:
    """Tensors, numpy arrays and numpy scalars as Python lists and numbers."""
    if value is not None and not isinstance(value, (str, bytes)) and hasattr(value, "tolist"):
        return value.tolist()
    return value


class Plain:
    """`plain_value` for the samples' fields: an array shared by many samples becomes one list
    (the pickle stored it once), and the values it makes are charged to the budget."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.made: dict[int, Any] = {}

    def __call__(self, value: Any) -> Any:
        if value is None or isinstance(value, (str, bytes)) or not hasattr(value, "tolist"):
            return value
        made = self.made.get(id(value))
        if made is None:
            size = getattr(value, "size", 1)
            self.budget.charge(size if isinstance(size, int) else 1, "an array's values")
            made = self.made[id(value)] = value.tolist()
        return made


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return repr(value)


class Sizes:
    """How many values a field expands to once written out, with the sizes of shared
    containers remembered, so that a pickle referencing one list from many places is
    measured without being walked again; a container inside itself is a cycle."""

    _OPEN = -1

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.sizes: dict[int, int] = {}

    @staticmethod
    def _children(node: Any) -> Iterable[Any]:
        if isinstance(node, dict):
            return chain(node.keys(), node.values())
        return node  # type: ignore[no-any-return]

    @staticmethod
    def _leaf_size(value: Any) -> int:
        if isinstance(value, str | bytes | bytearray):
            return len(value) + 1
        size = getattr(value, "size", None)
        return size + 1 if isinstance(size, int) else 1

    @staticmethod
    def _container(value: Any) -> bool:
        return isinstance(value, list | tuple | dict | set | frozenset)

    def size(self, root: Any, what: str) -> int:
        if not self._container(root):
            return self._leaf_size(root)
        stack: list[tuple[Any, bool]] = [(root, False)]
        while stack:
            node, done = stack.pop()
            key = id(node)
            if done:
                total = 1 + sum(
                    self.sizes[id(child)] if self._container(child) else self._leaf_size(child)
                    for child in self._children(node)
                )
                if total > self.budget.left:
                    self.budget.charge(total, what)
                self.sizes[key] = total
                continue
            if key in self.sizes:
                continue
            if type(node) in LISTS and set(map(type, node)) <= _NUMBERS:
                self.sizes[key] = 1 + len(node)
                continue
            self.sizes[key] = self._OPEN
            stack.append((node, True))
            for child in self._children(node):
                if self._container(child):
                    state = self.sizes.get(id(child))
                    if state == self._OPEN:
                        raise Malformed("refers to itself (a cycle)")
                    if state is None:
                        stack.append((child, False))
        return self.sizes[id(root)]


def json_text(value: Any, sizes: Sizes, what: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    sizes.budget.charge(sizes.size(value, what), what)
    try:
        return json.dumps(value, default=_json_default, ensure_ascii=False)
    except (ValueError, TypeError, RecursionError) as exc:
        raise Malformed(f"is not JSON text ({first_sentence(exc)})") from None


def field_error(
    path: Path, name: str, dtype: pl.DataType | None, position: int, value: Any, reason: str
) -> StepError:
    fits = f" does not fit {dtype}" if dtype is not None else ""
    return step_error(
        "malformed_dump",
        f"{path}: field {name}{fits} on sample {position} ({preview(value)}): {reason}",
    )


def _list_problem(values: list[Any], numeric: bool) -> tuple[int, str] | None:
    """The first sample whose value is not a flat list (Polars would recurse into it)."""
    if set(map(type, values)) <= {list, tuple, _NONE}:
        inner = set(map(type, chain.from_iterable(filter(None, values))))
        if all(_is_leaf(kind, numeric) for kind in inner):
            return None
    for position, value in enumerate(values):
        if value is None:
            continue
        if type(value) not in LISTS:
            return position, f"a {type(value).__name__} where a list belongs"
        for at, element in enumerate(value):
            if element is value:
                return position, f"element {at} is the list itself (a cycle)"
            if not _is_leaf(type(element), numeric):
                kind = type(element).__name__
                return position, f"element {at} is a {kind}, not {_what_belongs(numeric)}"
    return None


def _scalar_problem(values: list[Any], numeric: bool) -> tuple[int, str] | None:
    if all(_is_leaf(kind, numeric) for kind in set(map(type, values))):
        return None
    for position, value in enumerate(values):
        if not _is_leaf(type(value), numeric):
            kind = type(value).__name__
            return position, f"a {kind} where {_what_belongs(numeric)} belongs"
    return None


def column_series(
    name: str, values: list[Any], dtype: pl.DataType, path: Path, budget: Budget
) -> pl.Series:
    if isinstance(dtype, pl.List):
        problem = _list_problem(values, dtype.inner.is_numeric())
        if problem is None:
            budget.charge(sum(map(len, filter(None, values))), f"field {name}")
    elif isinstance(dtype, pl.Struct):
        problem = None  # built by `_reward_values` from numbers only
    else:
        problem = _scalar_problem(values, dtype.is_numeric())
        if problem is None and isinstance(dtype, pl.String):
            budget.charge(sum(len(v) for v in values if type(v) is str), f"field {name}")
    if problem is not None:
        position, reason = problem
        raise field_error(path, name, dtype, position, values[position], reason)
    try:
        return pl.Series(name, values, dtype=dtype, strict=True)
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError) as exc:
        bad = next((i for i, v in enumerate(values) if not _fits(name, v, dtype)), None)
        where = f" on sample {bad} ({preview(values[bad])})" if bad is not None else ""
        raise step_error(
            "malformed_dump",
            f"{path}: field {name} does not fit {dtype}{where}: {first_sentence(exc)}",
        ) from None


def _fits(name: str, value: Any, dtype: pl.DataType) -> bool:
    try:
        pl.Series(name, [value], dtype=dtype, strict=True)
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
        return False
    return True

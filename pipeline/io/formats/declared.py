"""What a dump format declares its payload holds, and the one check of a payload against it.

A format names each value it takes and what that value must be: a `Tensor` (its
dimensions by name, a tuple of names being their sum, and the kinds of numbers it may
hold), `Texts` (one string per row, no null), `Rows` (a list of records, one per row) or a
`StepNumber` (an integer that fits int64). `check` binds each dimension name the first time
it meets it and holds every later value to it, so a format states its shapes once instead
of unpacking them by hand (where a 3-D `prompts` would be a traceback). A dimension listed
in `nonzero` must not be 0: a dump of no rows, or responses of no width, is no step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

INT64_MAX = 2**63 - 1

Dim = str | tuple[str, ...]

_KIND_NAMES = {"i": "signed integers", "u": "unsigned integers", "b": "bools", "f": "floats"}


class Malformed(Exception):
    """A payload that breaks what its format declares (or a sample field that cannot become
    its column): one line saying what, without the file's name (the frame adds it)."""


class OutOfRange(Malformed):
    """A step number the payload holds that does not fit int64 (named by what holds it)."""


@dataclass(frozen=True)
class Tensor:
    dims: tuple[Dim, ...]
    kinds: str = "iub"  # numpy kinds: signed, unsigned, bool
    required: bool = True


@dataclass(frozen=True)
class Texts:
    dim: str = "rows"
    required: bool = True


@dataclass(frozen=True)
class Rows:
    of: type = dict
    dim: str = "rows"
    required: bool = True


@dataclass(frozen=True)
class StepNumber:
    required: bool = True


Declared = Mapping[str, Tensor | Texts | Rows | StepNumber]


def _dim_text(dim: Dim) -> str:
    return " + ".join(dim) if isinstance(dim, tuple) else dim


def _kinds_text(kinds: str) -> str:
    return " or ".join(_KIND_NAMES.get(kind, kind) for kind in kinds)


class _Sizes:
    def __init__(self) -> None:
        self.bound: dict[str, int] = {}

    def expect(self, dim: Dim) -> int | None:
        if isinstance(dim, tuple):
            parts = [self.bound.get(name) for name in dim]
            return None if None in parts else sum(p for p in parts if p is not None)
        return self.bound.get(dim)

    def bind(self, name: str, dims: tuple[Dim, ...], shape: tuple[int, ...]) -> None:
        names = "(" + ", ".join(map(_dim_text, dims)) + ")"
        if len(shape) != len(dims):
            raise Malformed(
                f"{name} has {len(shape)} dimensions (shape {shape}), not {len(dims)} {names}"
            )
        for dim, size in zip(dims, shape, strict=True):
            want = self.expect(dim)
            if want is None and isinstance(dim, str):
                self.bound[dim] = size
            elif want is not None and want != size:
                wanted = tuple(self.expect(d) for d in dims)
                raise Malformed(f"{name} has shape {shape}, not {wanted} {names}")


def _is_int(value: Any) -> bool:
    import numpy as np

    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def _check_texts(name: str, value: Any) -> None:
    """Every element a string: Polars' strict conversion checks them at once; only a
    failure looks for the row to name."""
    import polars as pl

    items = value.tolist()
    try:
        texts = pl.Series(values=items, dtype=pl.String, strict=True)
    except (TypeError, ValueError, pl.exceptions.PolarsError):
        texts = None
    if texts is not None and not texts.null_count():
        return
    row = next(i for i, item in enumerate(items) if type(item) is not str)
    found = items[row]
    raise Malformed(
        f"{name} holds {repr(found)[:40]} ({type(found).__name__}) on row {row}, not a string"
    )


def check(
    values: Any, declared: Declared, what: str, nonzero: tuple[str, ...] = ()
) -> dict[str, int]:
    """The sizes of `declared`'s dimensions in `values` (a mapping of the payload's values);
    Malformed on the first value that is missing, of another kind, or of another shape."""
    import numpy as np

    if not isinstance(values, Mapping):
        raise Malformed(f"a {type(values).__name__}, not {what}")
    sizes = _Sizes()
    for name, spec in declared.items():
        value = values.get(name)
        if value is None:
            if spec.required:
                raise Malformed(f"no {name}: {what} holds it")
            continue
        if isinstance(spec, StepNumber):
            if not _is_int(value):
                raise Malformed(f"{name} {repr(value)[:40]} is not a step number")
            if not 0 <= int(value) <= INT64_MAX:
                raise OutOfRange(f"{name} {int(value)}")
        elif isinstance(spec, Rows):
            if type(value) is not list:
                raise Malformed(f"{name} is a {type(value).__name__}, not a list")
            for position, row in enumerate(value):
                if not isinstance(row, spec.of):
                    kind, want = type(row).__name__, spec.of.__name__
                    raise Malformed(f"{name[:-1]} {position} is a {kind}, not a {want}")
            sizes.bind(name, (spec.dim,), (len(value),))
        elif isinstance(spec, Tensor):
            if not isinstance(value, np.ndarray):
                raise Malformed(f"{name} is a {type(value).__name__}, not a tensor")
            sizes.bind(name, spec.dims, value.shape)
            if value.dtype.kind not in spec.kinds:
                raise Malformed(f"{name} holds {value.dtype}, not {_kinds_text(spec.kinds)}")
        else:
            if not isinstance(value, np.ndarray):
                raise Malformed(f"{name} is a {type(value).__name__}, not an array of strings")
            sizes.bind(name, (spec.dim,), value.shape)
            _check_texts(name, value)
    for dim in nonzero:
        if sizes.bound.get(dim) == 0:
            what_is_0 = "holds 0 rows" if dim == "rows" else f"its {dim} is 0 wide"
            raise Malformed(f"{what_is_0}: a trainer dumps the rollouts it generated, never none")
    return sizes.bound

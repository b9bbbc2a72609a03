"""How a setting is declared, shared by the settings core (`pipeline.settings`) and each
trainer's settings model (`pipeline/trainers/<name>/settings.py`): the marks of strict
integers and the field helper with its metadata, and how a marked type is read."""

from __future__ import annotations

import dataclasses
import functools
import operator
import types
import typing
from typing import Annotated, Any, Literal


class Minimum:
    """The mark of a strict integer of at least `value` (never a bool, a float or a text)."""

    def __init__(self, value: int) -> None:
        self.value = value


Positive = Annotated[int, Minimum(1)]
NonNegative = Annotated[int, Minimum(0)]
# A count: an integer of at least 1.
Count = Positive


def setting(
    description: str,
    default: Any = dataclasses.MISSING,
    recorded: bool = True,
    valued: bool = False,
) -> Any:
    """A field of a settings model. `recorded=False`: a run option that does not change
    what is built (not in the manifest, not in the rerun digests); `valued`: a boolean
    named after a trainer's configuration key, given a value on the command line as there
    (`--balance-batch false`) rather than as a switch."""
    metadata = {"description": description, "recorded": recorded, "valued": valued}
    return dataclasses.field(default=default, metadata=metadata)


def minimum(kind: Any) -> int:
    """The least value of a marked integer (a count: 1)."""
    mark = typing.get_args(kind)[1]
    return int(getattr(mark, "value", 1))


def exact(kind: Any, value: Any) -> bool:
    """Whether `value` has exactly the type `kind` (pydantic would take it unchanged)."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        return any(exact(arg, value) for arg in typing.get_args(kind))
    if origin is Annotated:  # a count, or a size
        return type(value) is int and value >= minimum(kind)
    if origin is list:
        return type(value) is list and all(exact(typing.get_args(kind)[0], v) for v in value)
    if origin is Literal:
        return type(value) is str and value in typing.get_args(kind)
    if kind is type(None):
        return value is None
    return type(value) is kind


def plain(kind: Any) -> Any:
    """A field's type without its mark: `int | None` of `Count | None`."""
    if typing.get_origin(kind) is Annotated:
        return typing.get_args(kind)[0]
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return functools.reduce(operator.or_, [plain(arg) for arg in typing.get_args(kind)])
    return kind


def non_null(kind: Any) -> Any:
    """A setting's type without null: `int` of `int | None`, `bool` of `bool`."""
    if typing.get_origin(kind) not in (typing.Union, types.UnionType):
        return kind
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    return args[0] if len(args) == 1 else kind

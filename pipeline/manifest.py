"""The manifest of a step folder (`manifest.json`), typed, read and written here only.

A step's manifest is written last, so its presence means the step is complete. One that
cannot be read, or does not have this shape, is as good as none: the step is rebuilt.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

MANIFEST = "manifest.json"
R = TypeVar("R", bound="_Record")


class ShapeError(ValueError):
    """A manifest (or one of its records) that does not have the typed shape below."""


_TYPES: dict[type, dict[str, Any]] = {}


def _types(cls: type) -> dict[str, Any]:
    """A record's field types, resolved once (the annotations are text)."""
    if cls not in _TYPES:
        _TYPES[cls] = typing.get_type_hints(cls)
    return _TYPES[cls]


def _value(kind: Any, value: Any, where: str) -> Any:
    """`value` checked strictly against `kind` (no bool for int, no text for a number;
    an int is a float, as in JSON), nested records built from their dicts."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return value
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        if value is None:
            return None
        return _value(next(a for a in args if a is not type(None)), value, where)
    if origin is list:
        if not isinstance(value, list):
            raise ShapeError(f"{where}: not a list")
        return [_value(args[0], item, f"{where}[{i}]") for i, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ShapeError(f"{where}: not a mapping of names")
        return {k: _value(args[1], v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(kind, type) and issubclass(kind, _Record):
        if isinstance(value, kind):
            return value
        if not isinstance(value, dict):
            raise ShapeError(f"{where}: not a record")
        return kind.from_dict(value, where)
    if kind is float and type(value) is int:
        return float(value)
    if type(value) is not kind:
        raise ShapeError(f"{where}: {type(value).__name__}, not {kind.__name__}")
    return value


class _Record:
    """A dataclass whose fields hold exactly their annotated types: checked when made and
    when read, so a numpy integer or a JSON text never reaches a manifest."""

    def __post_init__(self) -> None:
        for name, kind in _types(type(self)).items():
            setattr(self, name, _value(kind, getattr(self, name), name))

    @classmethod
    def from_dict(cls: type[R], data: dict[str, Any], where: str = "") -> R:
        """The record of a JSON object with exactly this record's fields (the optional ones
        may be left out)."""
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        if extra := sorted(set(data) - names):
            raise ShapeError(f"{where or cls.__name__}: unknown fields {extra}")
        try:
            return cls(**data)
        except TypeError as exc:  # a required field is missing
            raise ShapeError(f"{where or cls.__name__}: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload, no-any-return]

    def replace(self: R, **changes: Any) -> R:
        """A shallow copy with `changes`, checked."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


@dataclasses.dataclass
class InputFile(_Record):
    """One input file of the step, in batch order."""

    path: str
    sha256: str
    rows: int


@dataclasses.dataclass
class OutputFile(_Record):
    """One written file of the step folder (rank files, then the quarantine)."""

    path: str
    sha256: str
    rows: int
    tokens: int | None = None


@dataclasses.dataclass
class Counts(_Record):
    """Where every ingested row went: ingested = quarantined + trimmed + dropped + written.
    `untrained` counts written rows the trainer never trains (`train_step` null)."""

    ingested: int
    quarantined: int
    repaired: int
    trimmed: int
    dropped: int
    written: int
    untrained: int = 0

    def add_up(self) -> bool:
        return self.ingested == self.quarantined + self.trimmed + self.dropped + self.written


def _empty() -> Any:
    return dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Manifest(_Record):
    """Everything a step folder records about how it was built; `outputs` is empty until
    the files are written (the staged `train_batch` carries the rest)."""

    step: int
    settings: dict[str, Any]
    inputs: list[InputFile]
    counts: Counts
    repaired: dict[str, int]
    is_compact: bool
    global_batch_size: int
    dynamic_global_batch_size: int | None
    num_train_steps: int
    num_rollouts: list[int]
    num_microbatches: list[int] | None
    equal_reward_groups: int
    ignored_columns: list[str]
    # The optional shard columns this step really has (the others are null in its files).
    present_columns: list[str] = _empty()
    # The step's rollout metrics under the names miles logs them (docs/metrics.md).
    stats: dict[str, float] = dataclasses.field(default_factory=dict)
    outputs: list[OutputFile] = _empty()
    # Files under the inputs that look like this step's input but were not read (another
    # case of suffix, `.parq`, a FIFO), as the build's note on stderr names them.
    skipped_files: list[str] = _empty()
    # ranks holding rows the trainer never trains (`counts.untrained`), ascending
    untrained_ranks: list[int] = _empty()
    # rows the rollout-side schedule dropped: batch positions and raw rewards, for the
    # loader's batch-wide `raw_reward` (miles keeps them there)
    dropped_positions: list[int] = _empty()
    dropped_raw_reward: list[float | None] = _empty()

    @property
    def dp_size(self) -> int:
        return int(self.settings["dp_size"])

    def rank_outputs(self) -> list[OutputFile]:
        """The rank files' records (every output but the quarantine)."""
        return [o for o in self.outputs if o.path.startswith("rank=")]

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        """The manifest of a JSON text; ShapeError (a ValueError) when it has another shape."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ShapeError("a manifest is a JSON object")
        return cls.from_dict(data)

    def write(self, path: Path) -> None:
        """Write and fsync: the manifest is the step folder's commit record."""
        path.write_text(self.to_json())
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    @classmethod
    def read(cls, path: Path) -> Manifest | None:
        """The manifest at `path`; None when it is missing, unreadable or of another shape."""
        try:
            return cls.from_json(path.read_bytes())
        except (OSError, ValueError):
            return None

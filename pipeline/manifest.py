"""The manifest of a step folder (`manifest.json`), typed and written here (read from a
step folder by `step.freshness.manifest_at`).

A step's manifest is written last, so its presence means the step is complete. One that
cannot be read, or does not have this shape, is as good as none: the step is rebuilt.
The records are dataclasses; pydantic checks a manifest's shape when one is read (it is
imported only then: a build that writes a new step does not load it).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from pydantic import TypeAdapter

MANIFEST = "manifest.json"

# What pydantic holds a manifest read from JSON to: strict (no bool for an int, no text for
# a number; an int is a float, as in JSON) and without unknown fields.
_READ_STRICTLY = {"strict": True, "extra": "forbid"}


class ShapeError(ValueError):
    """A manifest (or one of its records) that is not JSON of the typed shape below."""


class _Record:
    """A record of the manifest: a dataclass written as a JSON object."""

    __pydantic_config__ = _READ_STRICTLY

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload, no-any-return]

    def replace(self, **changes: Any) -> Self:
        """A copy with `changes`."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    @classmethod
    def from_json(cls, text: str | bytes) -> Self:
        """The record of a JSON object with exactly this record's fields (the optional ones
        may be left out); ShapeError naming what differs otherwise."""
        from pydantic import ValidationError

        reader: type = cls
        try:
            return _reader(reader).validate_json(text)  # type: ignore[no-any-return]
        except ValidationError as exc:
            problems = [
                f"{'.'.join(map(str, error['loc'])) or cls.__name__}: {error['msg']}"
                for error in exc.errors(include_url=False)
            ]
            raise ShapeError("; ".join(problems)) from None


@functools.cache
def _reader(cls: type) -> TypeAdapter[Any]:
    from pydantic import TypeAdapter

    return TypeAdapter(cls)


@dataclass
class InputFile(_Record):
    """One input file of the step, in batch order; `path` as `input_path` records it."""

    path: str
    sha256: str
    rows: int

    @classmethod
    def of(cls, record: dict[str, Any]) -> InputFile:
        """The manifest's record of a read file (`path`, `sha256`, `rows`)."""
        return cls(path=input_path(record["path"]), sha256=record["sha256"], rows=record["rows"])


def input_path(path: str | Path) -> str:
    """An input's path as a manifest records it and the rerun check compares it: absolute,
    symbolic links resolved, so that the same file is the same input whatever the working
    folder it was named from (`my/rollouts` from one folder, `rollouts` from `my/`). A link
    that cannot be resolved (a loop: Python 3.11 raises RuntimeError, later ones OSError) is
    named by its absolute path; its read names it as `unreadable_file`. An object's URL
    is itself."""
    if str(path).startswith(("s3://", "gs://")):
        return str(path)
    try:
        return str(Path(path).resolve())
    except (RuntimeError, OSError):
        return os.path.abspath(path)


@dataclass
class OutputFile(_Record):
    """One written file of the step folder (rank files, then the quarantine)."""

    path: str
    sha256: str
    rows: int
    tokens: int | None = None
    # A rank file's `batch_position` and `raw_reward` values (pipeline.io.writer's
    # `raw_reward_sha256`): a reader of another rank checks the two columns it reads of
    # this file against it instead of hashing the whole file. None for the quarantine.
    raw_reward_sha256: str | None = None


@dataclass
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


def manifest_sha256(fields: dict[str, Any]) -> str:
    """sha256 of a manifest's fields but `manifest_sha256` as JSON with sorted keys, no
    spaces, ASCII only; the loader computes the same of the JSON it reads
    (loader/rollout_shards_loader/_manifest.py)."""
    fields = {k: v for k, v in fields.items() if k != "manifest_sha256"}
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
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
    present_columns: list[str] = field(default_factory=list)
    # The step's rollout metrics under the names miles logs them (docs/metrics.md).
    stats: dict[str, float] = field(default_factory=dict)
    outputs: list[OutputFile] = field(default_factory=list)
    # Files under the inputs that look like this step's input but were not read (another
    # case of suffix, `.parq`, a FIFO), as the build's note on stderr names them.
    skipped_files: list[str] = field(default_factory=list)
    # ranks holding rows the trainer never trains (`counts.untrained`), ascending
    untrained_ranks: list[int] = field(default_factory=list)
    # quarantined rows per rule they (or their trajectory) broke, or that set them aside
    # (`reward_group_kept_whole`, `max_weight_staleness`); a row counts under each
    quarantined_rules: dict[str, int] = field(default_factory=dict)
    # rows the rollout-side schedule dropped: batch positions and raw rewards, for the
    # loader's batch-wide `raw_reward` (miles keeps them there)
    dropped_positions: list[int] = field(default_factory=list)
    dropped_raw_reward: list[float | None] = field(default_factory=list)
    # The step's report page (`report.html`, also among `outputs`), or None where the build
    # had no figure library (the `report` extra): a missing report is recorded, not silent.
    report: str | None = None
    # The seal of the fields above (`manifest_sha256`), set whenever the manifest is written:
    # a reader (the loader) refuses a manifest edited after its build.
    manifest_sha256: str | None = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("manifest_sha256")
        data["manifest_sha256"] = manifest_sha256(data)
        return data

    @property
    def dp_size(self) -> int:
        return int(self.settings["dp_size"])

    def rank_outputs(self) -> list[OutputFile]:
        """The rank files' records (every output but the quarantine)."""
        return [o for o in self.outputs if o.path.startswith("rank=")]

    def to_json(self) -> str:
        """The manifest's JSON text; a value JSON has no type for (a numpy integer) is
        refused (TypeError) rather than written."""
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def write(self, path: Path) -> None:
        """Write and fsync: the manifest is the step folder's commit record."""
        path.write_text(self.to_json())
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

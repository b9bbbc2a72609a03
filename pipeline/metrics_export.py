"""A root's rollout metrics for the tools that chart live runs (docs/metrics.md).

Every committed step's manifest `stats`, with the step as miles' `rollout/step`, written as
TensorBoard event files (the scalars miles' TensorBoard backend logs: one tag per metric,
the rollout step as the event step, the value as float32) and as JSON Lines (one object per
step, full precision). The event files are written with the standard library: TFRecord
framing (length, masked CRC32C, data, masked CRC32C) around hand-encoded `Event` protobuf
messages, so exporting needs neither TensorFlow nor TensorBoard.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import secrets
import stat
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path

from pipeline.errors import StepError, UsageError, Violation
from pipeline.io import storage
from pipeline.io.discovery import STEP_FOLDER
from pipeline.io.regular import kind_of, read_regular
from pipeline.io.storage import ObjectRoot
from pipeline.manifest import Manifest
from pipeline.transforms.metrics import STEP

MANIFEST = "manifest.json"
# One file per export folder, replaced by each export: TensorBoard reads every file whose
# name holds "tfevents", so a second file would chart every step twice.
EVENTS_FILE = "events.out.tfevents.rollout-shards"
FILE_VERSION = b"brain.Event:2"


@dataclasses.dataclass(frozen=True)
class StepMetrics:
    """One committed step's metrics; `wall_time` is when its manifest was committed."""

    step: int
    stats: dict[str, float]
    wall_time: float

    def record(self) -> dict[str, float | int]:
        """The JSON Lines object: `rollout/step` first, then the stats in manifest order."""
        return {STEP: self.step} | {k: v for k, v in self.stats.items() if k != STEP}


def _step_folders(root: Path) -> list[Path]:
    if (root / MANIFEST).is_file():  # a step folder itself
        return [root]
    folders = [
        folder
        for folder in root.iterdir()
        if STEP_FOLDER.match(folder.name) and (folder / MANIFEST).is_file()
    ]
    return sorted(folders, key=lambda folder: int(folder.name.removeprefix("step=")))


def store_metrics(root: ObjectRoot) -> list[StepMetrics]:
    """`root_metrics` of an output root in an object store: one LIST, a GET per committed
    step's manifest (its commit); `wall_time` is the manifest's last-modified time."""
    steps = []
    for listed in storage.listing(root, ""):
        folder, _, name = listed.key.partition("/")
        if name != MANIFEST or not STEP_FOLDER.match(folder):
            continue
        stored = storage.get(root, listed.key)
        try:
            manifest = Manifest.from_json(stored.data if stored else b"")
        except ValueError as exc:
            violation = Violation(
                rule="unreadable_file",
                message=f"not a step manifest ({type(exc).__name__}: {exc})",
                files=[root.url(listed.key)],
            )
            raise StepError([violation]) from exc
        steps.append(StepMetrics(manifest.step, manifest.stats, listed.modified.timestamp()))
    if not steps:
        raise UsageError(f"no committed step (step=<N>/{MANIFEST}) under {root}")
    return sorted(steps, key=lambda metrics: metrics.step)


def root_metrics(root: Path | ObjectRoot) -> list[StepMetrics]:
    """The metrics of every committed step (`step=<N>/manifest.json`) under an output root,
    by step; `root` may also be one step folder. A folder that is not yet committed (no
    manifest) is not a step."""
    if isinstance(root, ObjectRoot):
        return store_metrics(root)
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is not a folder"
        raise UsageError(f"{root} {what}: give an output root of `rollout-shards build`")
    steps = []
    for folder in _step_folders(root):
        path = folder / MANIFEST
        try:
            manifest = Manifest.from_json(read_regular(path))
            wall_time = path.stat().st_mtime
        except (OSError, ValueError) as exc:
            violation = Violation(
                rule="unreadable_file",
                message=f"not a step manifest ({type(exc).__name__}: {exc})",
                files=[str(path)],
            )
            raise StepError([violation]) from exc
        steps.append(StepMetrics(manifest.step, manifest.stats, wall_time))
    if not steps:
        raise UsageError(f"no committed step (step=<N>/{MANIFEST}) under {root}")
    return steps


def jsonl_text(steps: Iterable[StepMetrics]) -> str:
    return "".join(json.dumps(step.record()) + "\n" for step in steps)


def _cell(value: float | None) -> str:
    """A value as a person reads it: a whole number without decimals, else 6 significant
    digits (the JSON Lines export keeps every digit); `-` where a step has no such metric."""
    if value is None:
        return "-"
    if math.isfinite(value) and value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.6g}"


def table_text(steps: Sequence[StepMetrics]) -> str:
    """The metrics as a table for a terminal: one row per metric (in the first step's
    manifest order, then any a later step adds), one column per step."""
    names = list(dict.fromkeys(k for s in steps for k in s.stats if k != STEP))
    header = ["metric", *(f"step {s.step}" for s in steps)]
    rows = [[name, *(_cell(s.stats.get(name)) for s in steps)] for name in names]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in [header, *rows]
    ]
    return "\n".join(lines) + "\n"


# --- TensorBoard event files -------------------------------------------------------------


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_CRC32C = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), the checksum of TFRecord framing."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tf_record(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return (
        length
        + struct.pack("<I", masked_crc32c(length))
        + data
        + struct.pack("<I", masked_crc32c(data))
    )


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _float32(value: float) -> bytes:
    # SummaryWriter.add_scalar stores a float32: beyond its range a value becomes infinite
    try:
        return struct.pack("<f", value)
    except OverflowError:
        return struct.pack("<f", math.copysign(math.inf, value))


def _scalar(tag: str, value: float) -> bytes:
    """`Summary.Value` with `tag` (field 1) and `simple_value` (field 2, float)."""
    return _length_delimited(1, tag.encode()) + _varint(2 << 3 | 5) + _float32(value)


def event(
    wall_time: float,
    step: int,
    *,
    file_version: bytes | None = None,
    scalars: Sequence[tuple[str, float]] = (),
) -> bytes:
    """An `Event` message: wall_time (field 1, double), step (2, int64), file_version (3)
    or a `Summary` (5) of scalar values (its field 1, repeated)."""
    out = _varint(1 << 3 | 1) + struct.pack("<d", wall_time) + _varint(2 << 3) + _varint(step)
    if file_version is not None:
        out += _length_delimited(3, file_version)
    if scalars:
        summary = b"".join(_length_delimited(1, _scalar(tag, value)) for tag, value in scalars)
        out += _length_delimited(5, summary)
    return out


def events_bytes(steps: Sequence[StepMetrics]) -> bytes:
    """The event file: the file-version event, then one event per step holding each of its
    metrics but `rollout/step`, which is the event's step (miles' TensorBoard backend drops
    the step key from the values and passes it as the step)."""
    first = steps[0].wall_time if steps else 0.0
    records = [tf_record(event(first, 0, file_version=FILE_VERSION))]
    for step in steps:
        scalars = [(name, value) for name, value in step.stats.items() if name != STEP]
        records.append(tf_record(event(step.wall_time, step.step, scalars=scalars)))
    return b"".join(records)


# --- writing -----------------------------------------------------------------------------


def _write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` in one rename, so a reader (TensorBoard polling) never sees half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}"
    # O_EXCL with the mode a plain open() uses (the umask applies), unlike mkstemp's 0600
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(staged, path)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise


def _not_replaceable(path: Path) -> str | None:
    """What is at `path` when it is neither nothing nor a regular file ("a FIFO"): a rename
    over a device node or a FIFO (`--jsonl /dev/null`) would put a plain file in its place."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    return None if stat.S_ISREG(mode) else kind_of(mode)


def check_targets(tensorboard: Path | None, jsonl: Path | None) -> None:
    """Refuse, before anything is written, a target that is not a folder (--tensorboard)
    or whose file is not a regular file."""
    if tensorboard is not None:
        if tensorboard.exists() and not tensorboard.is_dir():
            what = kind_of(os.stat(tensorboard).st_mode)
            raise UsageError(f"--tensorboard {tensorboard} is {what}, not a folder")
        path = tensorboard / EVENTS_FILE
        if (kind := _not_replaceable(path)) is not None:
            raise UsageError(f"--tensorboard {tensorboard}: {path} is {kind}, not a regular file")
    if jsonl is not None and (kind := _not_replaceable(jsonl)) is not None:
        raise UsageError(
            f"--jsonl {jsonl} is {kind}, not a regular file: give a file to write, or - for stdout"
        )


def write_jsonl(steps: Sequence[StepMetrics], path: Path) -> None:
    check_targets(None, path)
    _write_atomic(path, jsonl_text(steps).encode())


def write_tensorboard(steps: Sequence[StepMetrics], folder: Path) -> Path:
    """Write the event file into `folder` (a TensorBoard run); its path."""
    check_targets(folder, None)
    path = folder / EVENTS_FILE
    _write_atomic(path, events_bytes(steps))
    return path

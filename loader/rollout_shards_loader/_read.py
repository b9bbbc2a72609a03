"""A step folder of training shards -> one rank's rollout data as miles' trainer holds it.

miles builds the rank dict in `_package_shards` (per-row keys gathered by the rank's
partition, batch-wide keys copied whole) and completes it in `process_rollout_data_shard`
(`partition` popped, `total_lengths` reordered into the rank's rows). A rank file holds
its rows in that order already; this module turns its columns into the same Python lists.

What it reads is the step's: the step folder is opened once and every file is opened
relative to that open folder (a symlink is refused), so a rebuild that swaps the folder
(pipeline/io/writer.py replaces it whole by one rename) cannot mix two builds into one
read: the files come from the folder that was opened, or are gone (the old folder deleted
under the reader), and then the read starts over on the new folder. Each file read is
checked against the manifest: its row count, and the rank's own file by the sha256 of its
bytes, another rank's file (two columns of it are read) by the manifest's digest of
exactly those columns' values; and the manifest against the folder's step.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

MANIFEST = "manifest.json"
BATCH_POSITION = "batch_position"
RAW_REWARD = "raw_reward"
STEP_NAME = re.compile(r"^step=(\d+)$")
# Reads started over when the step folder was replaced under the reader; each rebuild
# that lands during one read costs one.
ATTEMPTS = 8
# Threads hashing a read's files while pyarrow decodes them.
HASHERS = 2
# A file hashed without being read whole is read in pieces of this size.
HASH_CHUNK = 1 << 20

# Per-row keys in the order miles' `_package_shards` gathers them (those the shards carry).
ROW_KEYS = (
    "tokens",
    "response_lengths",
    "rewards",
    "truncated",
    "loss_masks",
    "round_number",
    "sample_indices",
    "rollout_ids",
    "rollout_mask_sums",
    "rollout_log_probs",
    "teacher_log_probs",
    "weight_versions",
)
# Shard columns miles hands the trainer only when the batch has them.
OPTIONAL = ("round_number", "rollout_log_probs", "teacher_log_probs", "weight_versions")
# Shard columns that are ours or that miles does not hand the trainer.
NOT_HANDED = ("batch_position", "train_step", "micro_batch", "metadata", "step", "rank")


class ShardVerificationError(ValueError):
    """A file of a step folder is not what the step's manifest says it wrote: another
    build's or a changed file, a manifest of another step, or a path that leaves the
    folder. The message names the file."""


class _Replaced(Exception):
    """The step folder was replaced while it was read: read it again."""


def read_manifest(step_folder: str | Path) -> dict[str, Any]:
    """The step's `manifest.json` as a dict; FileNotFoundError when the folder has none
    (a step folder without one is incomplete)."""
    path = Path(step_folder) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no manifest, so {step_folder} is not a complete step")
    return json.loads(path.read_text())


class _Folder:
    """A step folder held open: files are opened relative to it, never through a link."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        self.identity = _identity(os.fstat(self.fd))

    def close(self) -> None:
        os.close(self.fd)

    def replaced(self) -> bool:
        """Whether the folder's path now names another folder (or none)."""
        try:
            return _identity(os.stat(self.path)) != self.identity
        except FileNotFoundError:
            return True

    def open(self, name: str) -> tuple[int, os.stat_result]:
        """An open descriptor of the file `name` of this folder and its status; a symlink,
        a non-regular file or a name with a path in it is refused, a file gone because
        the folder was replaced means `_Replaced`."""
        path = self.path / name
        if "/" in name or name in (".", ".."):
            raise ShardVerificationError(f"{path}: a name outside the step folder")
        try:
            # O_NONBLOCK: a FIFO in the folder must not hang the reader (no effect on files)
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
            fd = os.open(name, flags, dir_fd=self.fd)
        except FileNotFoundError:
            if self.replaced():
                raise _Replaced from None
            missing = "no such file in the step folder"
            raise FileNotFoundError(errno.ENOENT, missing, str(path)) from None
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise ShardVerificationError(
                    f"{path}: a symbolic link; a step folder's files must be its own"
                ) from None
            raise
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise ShardVerificationError(f"{path}: not a regular file")
        return fd, info

    def read(self, name: str) -> bytearray:
        """The whole file `name` of this folder (see `open`)."""
        fd, info = self.open(name)
        with os.fdopen(fd, "rb", buffering=0) as handle:
            return _read_all(handle, info.st_size, self.path / name)


def _read_all(handle: Any, size: int, path: Path) -> bytearray:
    data = bytearray(size)
    view, done = memoryview(data), 0
    while done < size:
        got = handle.readinto(view[done:])
        if not got:
            break
        done += got
    if done != size or handle.read(1):
        raise ShardVerificationError(f"{path}: changed size while it was read")
    return data


# Files whose bytes this process hashed and found to be the manifest's, by device, inode,
# size and modification and change times: a step folder's files are never written in
# place (a rebuild writes new files), and changing a file's bytes changes its ctime, so a
# file with the same identity still holds the verified bytes.
_VERIFIED: dict[tuple[int, int, int, int, int], str] = {}
_VERIFIED_MAX = 4096


def _file_key(info: os.stat_result) -> tuple[int, int, int, int, int]:
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


def _identity(info: os.stat_result) -> tuple[int, int]:
    return info.st_dev, info.st_ino


def _rank_name(rank: int) -> str:
    return f"rank={rank}.parquet"


def _check_step(folder: Path, manifest: dict[str, Any]) -> None:
    match = STEP_NAME.match(folder.name)
    if match and int(manifest.get("step", -1)) != int(match.group(1)):
        raise ShardVerificationError(
            f"{folder / MANIFEST}: the manifest of step {manifest.get('step')}, in the folder "
            f"of step {match.group(1)}"
        )


def _record(folder: _Folder, manifest: dict[str, Any], name: str) -> dict[str, Any]:
    for output in manifest.get("outputs", []):
        if output.get("path") == name:
            return output
    raise ShardVerificationError(f"{folder.path / name}: not among the files the manifest lists")


class _Checks:
    """The sha256 checks of one read, hashed on threads while the files are decoded (both
    release the GIL); `wait` raises for the first file that is not the manifest's."""

    def __init__(self, folder: _Folder) -> None:
        self.folder = folder
        self.pool: ThreadPoolExecutor | None = None
        self.pending: list[tuple[Future[str] | None, Path, str, tuple[int, ...], int | None]] = []
        self.held: list[Any] = []

    def hold(self, handle: Any) -> None:
        """Keep `handle` open until the checks are done (a mapped file's identity is
        checked once its columns have been decoded)."""
        self.held.append(handle)

    def submit(
        self, data: bytearray | pa.Buffer | int, path: Path, sha256: str, key: tuple[int, ...]
    ) -> None:
        """Hash `data`: the bytes read, or an open file descriptor whose file must still
        have the identity `key` (so the same bytes) once its columns have been read."""
        if self.pool is None:
            self.pool = ThreadPoolExecutor(max_workers=HASHERS)
        fd = data if isinstance(data, int) else None
        self.pending.append((self.pool.submit(_sha256, data), path, sha256, key, fd))

    def unchanged(self, fd: int, path: Path, key: tuple[int, ...]) -> None:
        """A file verified before: it must still have the identity `key` once read."""
        self.pending.append((None, path, "", key, fd))

    def wait(self) -> None:
        try:
            for future, path, sha256, key, fd in self.pending:
                if future is not None and future.result() != sha256:
                    if self.folder.replaced():
                        raise _Replaced
                    raise _not_the_manifests(path, sha256)
                if fd is not None and _file_key(os.fstat(fd)) != key:
                    # deleting the file (a rebuild retiring the folder) changes it too
                    if self.folder.replaced():
                        raise _Replaced
                    raise ShardVerificationError(f"{path}: changed while it was read")
                if future is None:
                    continue
                if len(_VERIFIED) >= _VERIFIED_MAX:
                    _VERIFIED.pop(next(iter(_VERIFIED)))
                _VERIFIED[key] = sha256  # type: ignore[index]
        finally:
            self.close()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None
        for handle in self.held:
            handle.close()
        self.held = []


def _not_the_manifests(path: Path, sha256: str) -> ShardVerificationError:
    return ShardVerificationError(
        f"{path}: its sha256 is not the manifest's ({sha256[:12]}...): the file is not the "
        "one this step's build wrote"
    )


def _sha256(data: bytearray | pa.Buffer | int) -> str:
    if not isinstance(data, int):
        return hashlib.sha256(memoryview(data)).hexdigest()
    digest, offset = hashlib.sha256(), 0
    while chunk := os.pread(data, HASH_CHUNK, offset):  # pread: the reader's offset stays
        digest.update(chunk)
        offset += len(chunk)
    return digest.hexdigest()


def _open_own_file(
    folder: _Folder, manifest: dict[str, Any], name: str, verify: bool, checks: _Checks
) -> tuple[pq.ParquetFile, pa.Buffer]:
    """The reading rank's file `name`, mapped whole, as a ParquetFile and the mapping, its
    row count checked against the manifest and its sha256 handed to `checks` (once per
    process and file). The mapping is of the open file itself (through /proc, not its
    name, so a rebuild's swap cannot put another file there): hashed and decoded from one
    mapping without a copy; `read_table` on it decodes row groups in parallel, where
    `ParquetFile.read` does not. A step's files are never written in place, and one that
    was (its change time moves) fails the read once its columns are decoded."""
    record = _record(folder, manifest, name)
    path = folder.path / name
    fd, info = folder.open(name)
    key = _file_key(info)
    handle = os.fdopen(fd, "rb", buffering=0)
    try:
        keep = pa.memory_map(f"/proc/self/fd/{fd}").read_buffer()
        if keep.size != info.st_size:
            raise ShardVerificationError(f"{path}: changed size while it was read")
        if verify and _VERIFIED.get(key) != record["sha256"]:
            checks.submit(keep, path, record["sha256"], key)
        parquet = pq.ParquetFile(pa.BufferReader(keep))
        if verify:
            _check_rows(parquet, record, path)
    except BaseException:
        handle.close()
        raise
    checks.hold(handle)
    if verify:
        checks.unchanged(fd, path, key)
    return parquet, keep


def _open_other_file(
    folder: _Folder, manifest: dict[str, Any], name: str, verify: bool, checks: _Checks
) -> tuple[pq.ParquetFile, Any, pa.Table]:
    """Another rank's file `name`: a ParquetFile, the handle to close after reading it,
    and its `batch_position` and `raw_reward` (what the batch-wide `raw_reward` needs of
    it), its row count checked against the manifest. Those two columns are checked
    against the manifest's `raw_reward_sha256` of the file, exactly the values read; a
    manifest without one (written before it existed) has the whole file's sha256 handed
    to `checks` instead (once per process and file)."""
    record = _record(folder, manifest, name)
    path = folder.path / name
    fd, info = folder.open(name)
    key = _file_key(info)
    known = not verify or _VERIFIED.get(key) == record["sha256"]
    values = None if known else record.get("raw_reward_sha256")
    handle = os.fdopen(fd, "rb")
    try:
        try:
            parquet = pq.ParquetFile(handle)
            if verify:
                _check_rows(parquet, record, path)
            part = parquet.read(columns=[BATCH_POSITION, RAW_REWARD])
        except ShardVerificationError:
            raise
        except Exception:
            # a file pyarrow cannot read: named by its sha256 when it is not the build's
            if verify and _sha256(fd) != record["sha256"]:
                if folder.replaced():
                    raise _Replaced from None
                raise _not_the_manifests(path, record["sha256"]) from None
            raise
        if values is not None and _raw_reward_sha256(part) != values:
            if folder.replaced():
                raise _Replaced
            raise ShardVerificationError(
                f"{path}: its batch_position and raw_reward are not the manifest's "
                f"(raw_reward_sha256 {str(values)[:12]}...): the file is not the one this "
                "step's build wrote"
            )
    except BaseException:
        handle.close()
        raise
    if values is None and not known:
        # an older manifest: the whole file hashed beside the reads, not copied
        checks.submit(fd, path, record["sha256"], key)
    elif known and verify:
        checks.unchanged(fd, path, key)
    return parquet, handle, part


def _check_rows(parquet: pq.ParquetFile, record: dict[str, Any], path: Path) -> None:
    if parquet.metadata.num_rows != record["rows"]:
        raise ShardVerificationError(
            f"{path}: {parquet.metadata.num_rows} rows, the manifest says {record['rows']}"
        )


def _raw_reward_sha256(part: pa.Table) -> str | None:
    """The manifest's `raw_reward_sha256` computed again from a rank file's two columns
    (pipeline.io.writer's `raw_reward_sha256` defines it: `batch_position` int64, then
    `raw_reward` float64 with a null as 0.0, then a byte per row, 1 where it is set, all
    little-endian in row order); None when the columns are not of the written types."""
    positions, rewards = part.column(BATCH_POSITION), part.column(RAW_REWARD)
    if positions.type != pa.int64() or rewards.type != pa.float64() or positions.null_count:
        return None
    digest = hashlib.sha256()
    digest.update(np.ascontiguousarray(_scalar_array(positions), dtype="<i8"))
    filled = rewards.fill_null(0.0) if rewards.null_count else rewards
    digest.update(np.ascontiguousarray(_scalar_array(filled), dtype="<f8"))
    valid = pc.is_valid(rewards).to_numpy(zero_copy_only=False)
    digest.update(np.ascontiguousarray(valid, dtype=np.uint8))
    return digest.hexdigest()


def _present(manifest: dict[str, Any], files: list[pq.ParquetFile]) -> set[str]:
    """The optional columns of this batch: the manifest's `present_columns` when it lists
    them (every step then has every column, null where absent), else the files' columns."""
    listed = manifest.get("present_columns")
    if listed is not None:
        return set(listed) & set(OPTIONAL)
    names: set[str] = set()
    for parquet in files:
        names.update(parquet.schema_arrow.names)
    return names & set(OPTIONAL)


class Ragged(NamedTuple):
    """A ragged column with `as_numpy=True`: row i is `values[offsets[i]:offsets[i + 1]]`.

    `offsets` is int64 of length rows + 1, starting at 0; `valid` is None when no row is
    null, else a bool array (False: the row is null; its slice holds no data)."""

    values: np.ndarray
    offsets: np.ndarray
    valid: np.ndarray | None = None

    def tolist(self, null_empty: bool = False) -> list[Any]:
        """The rows as Python lists (null rows None, or [] with `null_empty`), the same
        values `read_rank` gives without `as_numpy`."""
        if self.values.dtype == object:  # strings: one flat list, sliced per row
            flat = self.values.tolist()
            bounds = self.offsets.tolist()
            rows: list[Any] = [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        else:  # measured faster than slicing one flat list: each piece converts in C
            pieces = np.split(self.values, self.offsets[1:-1])
            rows = [piece.tolist() for piece in pieces] if len(self.offsets) > 1 else []
        if self.valid is not None:
            for i in np.flatnonzero(~self.valid).tolist():
                rows[i] = [] if null_empty else None
        return rows


def _scalar_array(column: pa.ChunkedArray) -> np.ndarray:
    """A scalar column as numpy (one chunk is zero-copy; nulls become NaN / None)."""
    if column.num_chunks == 1:
        return column.chunk(0).to_numpy(zero_copy_only=False)
    return column.to_numpy()


def _scalars(column: pa.ChunkedArray) -> list[Any]:
    if column.null_count:
        return column.to_pylist()
    return _scalar_array(column).tolist()


def _ragged(column: pa.ChunkedArray) -> Ragged:
    """A list column as its flat values (numpy, one conversion) and row offsets."""
    array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if not pa.types.is_list(array.type) and not pa.types.is_large_list(array.type):
        raise TypeError(f"expected a list column, got {array.type}")
    offsets = array.offsets.to_numpy().astype(np.int64, copy=False)
    start, end = int(offsets[0]), int(offsets[-1])
    values = array.values.slice(start, end - start).to_numpy(zero_copy_only=False)
    valid = None
    if array.null_count:
        valid = array.is_valid().to_numpy(zero_copy_only=False)
    return Ragged(values, offsets - start if start else offsets, valid)


def _lists(column: pa.ChunkedArray, null_empty: bool = False) -> list[Any]:
    """A list column as Python lists: the flat values as numpy, cut at the row offsets,
    each piece's `tolist` (float32 becomes the Python float of the float32 value, as
    miles has it). A null row is None, or an empty list with `null_empty`
    (miles' default for `weight_versions`)."""
    return _ragged(column).tolist(null_empty)


def _batch_raw_reward(
    manifest: dict[str, Any],
    parts: dict[int, pa.Table],
    rank: int,
    table: pa.Table,
    as_numpy: bool,
) -> Any:
    """`raw_reward` of the whole trimmed batch in batch order: every rank's rows (`parts`:
    the other ranks' `batch_position` and `raw_reward`), and the rows the rollout-side
    schedule dropped (recorded in the manifest)."""
    positions = [np.asarray(manifest.get("dropped_positions", []), dtype=np.int64)]
    columns: list[pa.ChunkedArray] = []
    for other in range(len(parts) + 1):
        part = table if other == rank else parts[other]
        positions.append(_scalar_array(part.column(BATCH_POSITION)).astype(np.int64))
        columns.append(part.column(RAW_REWARD))
    flat_positions = np.concatenate(positions)
    dropped = list(manifest.get("dropped_raw_reward", []))
    if as_numpy or not any(c.null_count for c in columns):
        arrays = [_scalar_array(c) for c in columns]
        dtype = np.result_type(*arrays) if arrays else np.float64
        values = np.concatenate([np.asarray(dropped, dtype=dtype), *arrays])
        batch = np.empty(len(flat_positions), dtype=values.dtype)
        batch[flat_positions] = values
        return batch if as_numpy else batch.tolist()
    chunks = [dropped, *(c.to_pylist() for c in columns)]
    batch = np.empty(len(flat_positions), dtype=object)
    batch[flat_positions] = np.fromiter(
        (v for chunk in chunks for v in chunk), dtype=object, count=len(flat_positions)
    )
    return batch.tolist()


def _micro_batch_indices(table: pa.Table) -> list[list[int]]:
    """miles' `micro_batch_indices[rank]`: per train step and micro-batch, in the rank's
    order, the local row positions of that micro-batch."""
    step = table.column("train_step").combine_chunks().to_numpy(zero_copy_only=False)
    micro = table.column("micro_batch").combine_chunks().to_numpy(zero_copy_only=False)
    n = len(step)
    if n == 0:
        return []
    change = np.flatnonzero((step[1:] != step[:-1]) | (micro[1:] != micro[:-1])) + 1
    bounds = [0, *change.tolist(), n]
    return [list(range(a, b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def read_rank(
    step_folder: str | Path,
    rank: int,
    *,
    dp_size: int | None = None,
    global_batch_size: int | None = None,
    as_numpy: bool = False,
    with_train_step: bool = False,
    verify: bool = True,
) -> dict[str, Any]:
    """Rank `rank`'s rollout data exactly as miles' trainer holds it after
    `process_rollout_data`: the same keys, values and Python types.

    `dp_size` and `global_batch_size` (the trainer's configured `--global-batch-size`, not
    the dynamic one), when given, must match the step's settings, else ValueError.

    With `as_numpy=True` the same keys hold numpy instead of Python lists: a per-row
    scalar key (and `raw_reward`) one array; a ragged key (`tokens`, `loss_masks`, log
    probs, `weight_versions`) a `Ragged(values, offsets, valid)`, row i being
    `values[offsets[i]:offsets[i + 1]]`. The batch-wide ints and lists
    (`dynamic_global_batch_size`, the schedule's keys) stay Python.

    `with_train_step=True` adds the key `train_step` (not miles'): per row, the optimizer
    step of this rollout step that trains it, None for a row never trained (as numpy, an
    int32 masked array, masked where None).

    Every file read is checked against the manifest (`verify=False` skips the digests and
    row counts, not the rest): the rank's own file by its sha256, another rank's file by
    the digest of the two columns read of it (`raw_reward_sha256`; by its sha256 when the
    manifest has none), each by its row count. A mismatch, a manifest of another step or a
    file that is a symbolic link raises ShardVerificationError naming the file. A rebuild
    of the step during the read makes it start over on the new folder (up to ATTEMPTS
    times), so the dict is always one build's.
    """

    def build(
        manifest: dict[str, Any],
        files: list[pq.ParquetFile],
        parts: dict[int, pa.Table],
        rank: int,
        own: pa.Buffer,
    ) -> dict[str, Any]:
        return _rank_dict(manifest, files, parts, rank, own, as_numpy, with_train_step)

    return read_with(step_folder, rank, build, dp_size, global_batch_size, verify)


# What a trainer's module makes of a verified read: (manifest, every rank's ParquetFile in
# rank order, the other ranks' `batch_position` and `raw_reward`, the rank, the rank's own
# file's bytes) -> its rank dict.
Build = Callable[
    [dict[str, Any], list[pq.ParquetFile], dict[int, pa.Table], int, pa.Buffer], dict[str, Any]
]


def read_with(
    step_folder: str | Path,
    rank: int,
    build: Build,
    dp_size: int | None,
    global_batch_size: int | None,
    verify: bool,
) -> dict[str, Any]:
    """`build`'s dict from one build of the step folder, every file checked as `read_rank`
    checks them (each trainer's loader module reads through here)."""
    folder = Path(step_folder)
    for attempt in range(ATTEMPTS):
        try:
            return _read_rank_once(folder, rank, dp_size, global_batch_size, build, verify)
        except _Replaced:
            time.sleep(0.002 * (attempt + 1))
    raise RuntimeError(
        f"{folder}: replaced by other builds {ATTEMPTS} times while it was read; try again"
    )


def _read_rank_once(
    path: Path,
    rank: int,
    dp_size: int | None,
    global_batch_size: int | None,
    build: Build,
    verify: bool,
) -> dict[str, Any]:
    try:
        folder = _Folder(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such step folder") from None
    try:
        try:
            raw = folder.read(MANIFEST)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{path / MANIFEST}: no manifest, so {path} is not a complete step"
            ) from None
        try:
            manifest = json.loads(bytes(raw))
        except ValueError:
            raise ShardVerificationError(f"{path / MANIFEST}: not a JSON manifest") from None
        try:
            step_dp = int(manifest["settings"]["dp_size"])
            step_gbs = int(manifest["settings"]["global_batch_size"])
        except (KeyError, TypeError, ValueError):
            raise ShardVerificationError(
                f"{path / MANIFEST}: not a rollout-shards manifest (no settings.dp_size and "
                "settings.global_batch_size)"
            ) from None
        _check_step(path, manifest)
        if dp_size is not None and dp_size != step_dp:
            raise ValueError(
                f"dp_size={dp_size} but the step {path} was built for dp_size={step_dp}"
            )
        if global_batch_size is not None and global_batch_size != step_gbs:
            raise ValueError(
                f"global_batch_size={global_batch_size} but the step {path} was built for "
                f"global_batch_size={step_gbs}"
            )
        if not 0 <= rank < step_dp:
            raise ValueError(f"rank={rank} is outside the step's dp_size={step_dp} ranks")
        files: dict[int, pq.ParquetFile] = {}
        parts: dict[int, pa.Table] = {}
        handles: list[Any] = []
        checks = _Checks(folder)
        try:
            try:
                # the own file first: its sha256 runs on a thread while the rest is read
                files[rank], own = _open_own_file(
                    folder, manifest, _rank_name(rank), verify, checks
                )
                for r in range(step_dp):
                    if r != rank:
                        files[r], handle, parts[r] = _open_other_file(
                            folder, manifest, _rank_name(r), verify, checks
                        )
                        handles.append(handle)
                ordered = [files[r] for r in range(step_dp)]
                data = build(manifest, ordered, parts, rank, own)
            except Exception:
                checks.wait()  # a file that is not the manifest's is the error to report
                raise
            checks.wait()
            return data
        finally:
            checks.close()
            for handle in handles:
                handle.close()
    finally:
        folder.close()


def _rank_dict(
    manifest: dict[str, Any],
    files: list[pq.ParquetFile],
    parts: dict[int, pa.Table],
    rank: int,
    own: pa.Buffer,
    as_numpy: bool,
    with_train_step: bool,
) -> dict[str, Any]:
    trainer = manifest["settings"].get("trainer", "miles")
    if trainer != "miles":
        raise ValueError(
            f"the step was built for the {trainer} trainer: read it with "
            f"rollout_shards_loader.{trainer}.read_rank"
        )
    present = _present(manifest, files)
    scheduled = manifest.get("num_microbatches") is not None
    wanted = [k for k in ROW_KEYS if k not in OPTIONAL or k in present]
    extra = [BATCH_POSITION, RAW_REWARD, "total_lengths"]
    if scheduled:
        extra += ["train_step", "micro_batch"]
    elif with_train_step:
        extra.append("train_step")
    table = pq.read_table(pa.BufferReader(own), columns=[*wanted, *extra])

    data: dict[str, Any] = {}
    for key in wanted:
        column = table.column(key)
        ragged = pa.types.is_list(column.type) or pa.types.is_large_list(column.type)
        if as_numpy:
            data[key] = _ragged(column) if ragged else _scalar_array(column)
        elif ragged:
            data[key] = _lists(column, null_empty=key == "weight_versions")
        else:
            data[key] = _scalars(column)
    data["raw_reward"] = _batch_raw_reward(manifest, parts, rank, table, as_numpy)
    total = table.column("total_lengths")
    data["total_lengths"] = _scalar_array(total) if as_numpy else _scalars(total)
    dynamic = manifest.get("dynamic_global_batch_size")
    if dynamic is not None:
        data["dynamic_global_batch_size"] = int(dynamic)
    if scheduled:
        data["num_microbatches"] = list(manifest["num_microbatches"])
        data["micro_batch_indices"] = _micro_batch_indices(table)
        data["num_rollouts"] = list(manifest["num_rollouts"])
    if with_train_step:
        data["train_step"] = _train_steps(table.column("train_step"), as_numpy)
    return data


def _train_steps(column: pa.ChunkedArray, as_numpy: bool) -> Any:
    if not as_numpy:
        return column.to_pylist()
    array = column.combine_chunks()
    values = array.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    return np.ma.MaskedArray(values, mask=array.is_null().to_numpy(zero_copy_only=False))

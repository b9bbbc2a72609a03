"""Verifying a step's files against its manifest: row counts, the sha256 of the reading
rank's own file, and for another rank's file the manifest's digest of exactly the two
columns read of it (`raw_reward_sha256`)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rollout_shards_loader._convert import scalar_array
from rollout_shards_loader._folder import Folder, Replaced, ShardVerificationError

BATCH_POSITION = "batch_position"
RAW_REWARD = "raw_reward"
# The columns of another rank's file that the manifest's `raw_reward_sha256` covers.
DIGESTED = (BATCH_POSITION, RAW_REWARD)
# Threads hashing a read's files while pyarrow decodes them.
HASHERS = 2
# A file hashed without being read whole is read in pieces of this size.
HASH_CHUNK = 1 << 20

# Files whose bytes this process hashed and found to be the manifest's, by device, inode,
# size and modification and change times: a step folder's files are never written in
# place (a rebuild writes new files), and changing a file's bytes changes its ctime, so a
# file with the same identity still holds the verified bytes.
_VERIFIED: dict[tuple[int, int, int, int, int], str] = {}
_VERIFIED_MAX = 4096


def _file_key(info: os.stat_result) -> tuple[int, int, int, int, int]:
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


def _record(folder: Folder, manifest: dict[str, Any], name: str) -> dict[str, Any]:
    for output in manifest["outputs"]:
        if output["path"] == name:
            return output  # type: ignore[no-any-return]
    raise ShardVerificationError(f"{folder.path / name}: not among the files the manifest lists")


class Checks:
    """The sha256 checks of one read, hashed on threads while the files are decoded (both
    release the GIL); `wait` raises for the first file that is not the manifest's."""

    def __init__(self, folder: Folder) -> None:
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
                        raise Replaced
                    raise _not_the_manifests(path, sha256)
                if fd is not None and _file_key(os.fstat(fd)) != key:
                    # deleting the file (a rebuild retiring the folder) changes it too
                    if self.folder.replaced():
                        raise Replaced
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


def open_own_file(
    folder: Folder, manifest: dict[str, Any], name: str, verify: bool, checks: Checks
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
        _check_rows(parquet, record, path)
    except BaseException:
        handle.close()
        raise
    checks.hold(handle)
    if verify:
        checks.unchanged(fd, path, key)
    return parquet, keep


def open_other_file(
    folder: Folder,
    manifest: dict[str, Any],
    name: str,
    verify: bool,
    checks: Checks,
    columns: Sequence[str] = DIGESTED,
) -> tuple[pq.ParquetFile, Any, pa.Table]:
    """Another rank's file `name`: a ParquetFile, the handle to close after reading it,
    and its `columns` (by default `batch_position` and `raw_reward`, what the batch-wide
    `raw_reward` needs of it), its row count checked against the manifest. Those two
    columns are checked against the manifest's `raw_reward_sha256` of the file, exactly
    the values read; other columns, or a manifest without the digest (written before it
    existed), have the whole file's sha256 handed to `checks` instead (once per process
    and file)."""
    record = _record(folder, manifest, name)
    path = folder.path / name
    fd, info = folder.open(name)
    key = _file_key(info)
    known = not verify or _VERIFIED.get(key) == record["sha256"]
    digested = tuple(columns) == DIGESTED
    values = None if known or not digested else record.get("raw_reward_sha256")
    handle = os.fdopen(fd, "rb")
    try:
        try:
            parquet = pq.ParquetFile(handle)
            _check_rows(parquet, record, path)
            part = parquet.read(columns=list(columns))
        except ShardVerificationError:
            raise
        except Exception:
            # a file pyarrow cannot read: named by its sha256 when it is not the build's
            if verify and _sha256(fd) != record["sha256"]:
                if folder.replaced():
                    raise Replaced from None
                raise _not_the_manifests(path, record["sha256"]) from None
            raise
        if values is not None and _raw_reward_sha256(part) != values:
            if folder.replaced():
                raise Replaced
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
    digest.update(np.ascontiguousarray(scalar_array(positions), dtype="<i8"))
    filled = rewards.fill_null(0.0) if rewards.null_count else rewards
    digest.update(np.ascontiguousarray(scalar_array(filled), dtype="<f8"))
    valid = pc.is_valid(rewards).to_numpy(zero_copy_only=False)
    digest.update(np.ascontiguousarray(valid, dtype=np.uint8))
    return digest.hexdigest()

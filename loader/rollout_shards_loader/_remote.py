"""A step in an object store (`s3://bucket/prefix/step=<N>`, `gs://...`), read through
pyarrow's own filesystems: the manifest first, then only the files it names.

The build stores a step's files under `step=<N>/_attempts/<id>/`, `<id>` the first 16 hex
digits of the manifest's `manifest_sha256`, and commits the manifest last with a
conditional PUT (pipeline/io/store_layout.py, docs/contract.md "Committing on object
storage"). A reader never lists: a listing that lags cannot show it a half step, and a
file the manifest names is there once the manifest is. A rebuild that replaces the
manifest while a rank is read makes the read start over (`Replaced`), as a swapped step
folder does on disk. Endpoint and credentials come from the standard chain
(`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, ...).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rollout_shards_loader._folder import MANIFEST, Replaced, ShardVerificationError

SCHEMES = ("s3://", "gs://")
ATTEMPTS_FOLDER = "_attempts"
ATTEMPT_CHARS = 16


def is_remote(path: object) -> bool:
    return isinstance(path, str) and path.startswith(SCHEMES)


class Url(str):
    """A URL that joins and names like a path (`url / name`, `url.name`, `url.parent`), so
    the loader's messages and checks take it where they take a folder's path."""

    def __truediv__(self, name: str) -> Url:
        return Url(f"{self.rstrip('/')}/{name}")

    @property
    def name(self) -> str:
        return self.rstrip("/").rsplit("/", 1)[-1]

    @property
    def parent(self) -> Url:
        return Url(self.rstrip("/").rsplit("/", 1)[0])


class RemoteFolder:
    """A step folder in an object store, with the manifest it was opened on (`read`
    MANIFEST first): every other file is read under the attempt prefix that manifest names."""

    def __init__(self, url: str) -> None:
        from pyarrow import fs

        self.path = Url(url.rstrip("/"))
        self.fs, self.base = fs.FileSystem.from_uri(self.path)
        self.manifest_bytes: bytes | None = None

    def close(self) -> None:
        pass

    def _key(self, name: str) -> str:
        if name == MANIFEST:
            return f"{self.base}/{MANIFEST}"
        if self.manifest_bytes is None:
            raise RuntimeError("the manifest is read first")
        seal = str(json.loads(self.manifest_bytes)["manifest_sha256"])[:ATTEMPT_CHARS]
        return f"{self.base}/{ATTEMPTS_FOLDER}/{seal}/{name}"

    def _get(self, name: str) -> bytes:
        try:
            with self.fs.open_input_stream(self._key(name)) as stream:
                return bytes(stream.read())
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.path / name}: no such object") from None

    def read(self, name: str) -> bytearray:
        """The whole object `name` (one GET); the manifest is kept to name the others."""
        data = self._get(name)
        if name == MANIFEST and self.manifest_bytes is None:
            self.manifest_bytes = data
        return bytearray(data)

    def replaced(self) -> bool:
        """Whether the step's manifest is no longer the one this read opened."""
        try:
            return self._get(MANIFEST) != self.manifest_bytes
        except FileNotFoundError:
            return True

    def open_input(self, name: str) -> Any:
        """A random-access file of `name`: pyarrow reads its footer and the columns asked
        for with ranged GETs. A file missing under a manifest that moved is `Replaced`."""
        try:
            return self.fs.open_input_file(self._key(name))
        except FileNotFoundError:
            if self.replaced():
                raise Replaced from None
            raise FileNotFoundError(f"{self.path / name}: no such object") from None


def _record(folder: RemoteFolder, manifest: dict[str, Any], name: str) -> dict[str, Any]:
    for output in manifest["outputs"]:
        if output["path"] == name:
            return output  # type: ignore[no-any-return]
    raise ShardVerificationError(f"{folder.path / name}: not among the files the manifest lists")


def _check(folder: RemoteFolder, name: str, got: str, want: str, what: str) -> None:
    if got != want:
        if folder.replaced():
            raise Replaced
        raise ShardVerificationError(
            f"{folder.path / name}: its {what} is not the manifest's ({want[:12]}...): the "
            "file is not the one this step's build wrote"
        )


def _rows(parquet: pq.ParquetFile, record: dict[str, Any], path: str) -> None:
    if parquet.metadata.num_rows != record["rows"]:
        raise ShardVerificationError(
            f"{path}: {parquet.metadata.num_rows} rows, the manifest says {record['rows']}"
        )


def open_own_file(
    folder: RemoteFolder, manifest: dict[str, Any], name: str, verify: bool
) -> tuple[pq.ParquetFile, pa.Buffer]:
    """The reading rank's file, fetched whole (one GET) and its sha256 checked."""
    record = _record(folder, manifest, name)
    try:
        data = folder._get(name)
    except FileNotFoundError:
        if folder.replaced():
            raise Replaced from None
        raise
    if verify:
        _check(folder, name, hashlib.sha256(data).hexdigest(), record["sha256"], "sha256")
    keep = pa.py_buffer(data)
    parquet = pq.ParquetFile(pa.BufferReader(keep))
    _rows(parquet, record, folder.path / name)
    return parquet, keep


def open_other_file(
    folder: RemoteFolder,
    manifest: dict[str, Any],
    name: str,
    verify: bool,
    columns: Sequence[str],
    digested: Sequence[str],
    raw_reward_sha256: Any,
) -> tuple[pq.ParquetFile, Any, pa.Table]:
    """Another rank's file: its `columns` read by ranged GETs and checked against the
    manifest's `raw_reward_sha256` (the two `digested` columns), or the whole file fetched
    and its sha256 checked for other columns, as on disk (`_verify.open_other_file`)."""
    record = _record(folder, manifest, name)
    values = record.get("raw_reward_sha256") if tuple(columns) == tuple(digested) else None
    if verify and values is None:
        data = folder._get(name)
        _check(folder, name, hashlib.sha256(data).hexdigest(), record["sha256"], "sha256")
        handle: Any = pa.BufferReader(pa.py_buffer(data))
    else:
        handle = folder.open_input(name)
    parquet = pq.ParquetFile(handle)
    _rows(parquet, record, folder.path / name)
    part = parquet.read(columns=list(columns))
    if verify and values is not None:
        _check(folder, name, str(raw_reward_sha256(part)), values, "raw_reward_sha256")
    return parquet, handle, part

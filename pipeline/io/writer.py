"""The atomic step writer: rank shards, quarantine and manifest, committed by one rename."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import polars as pl

from pipeline.io.readers import sha256_of

MANIFEST = "manifest.json"
QUARANTINE = "quarantine.parquet"
# zstd level 1 writes nearly as fast as lz4 and reads everywhere a trainer reads Parquet.
PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 1,
    "statistics": False,
    "row_group_size": 4096,
}
RENAME_EXCHANGE = 2


def step_folder(out_root: Path, step: int) -> Path:
    return out_root / f"step={step}"


def rank_file(rank: int) -> str:
    return f"rank={rank}.parquet"


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2); False where the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    result = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), RENAME_EXCHANGE)
    return result == 0


def commit_folder(staged: Path, final: Path) -> None:
    """Move a complete staged folder to its final name; an existing folder is swapped out
    in one step, so a reader sees the old step or the new one, never a mix."""
    try:
        os.rename(staged, final)
    except OSError:
        if not _exchange(staged, final):
            retired = final.with_name(f".old-{final.name}-{uuid.uuid4().hex[:8]}")
            os.rename(final, retired)
            os.rename(staged, final)
            staged = retired
        shutil.rmtree(staged, ignore_errors=True)
    _fsync(final.parent)


def staging_folder(out_root: Path, step: int) -> Path:
    out_root.mkdir(parents=True, exist_ok=True)
    folder = out_root / f".tmp-step={step}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    return folder


def write_parquet(frame: pl.DataFrame, path: Path) -> None:
    frame.write_parquet(path, **PARQUET_OPTIONS)
    _fsync(path)


def write_manifest(manifest: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n")
    _fsync(path)


def file_record(path: Path, name: str, rows: int, tokens: int | None = None) -> dict[str, Any]:
    record: dict[str, Any] = {"path": name, "sha256": sha256_of(path), "rows": rows}
    if tokens is not None:
        record["tokens"] = tokens
    return record

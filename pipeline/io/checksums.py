"""The sha256 of files, and a head start on a build's inputs while the program loads.

`rollout-shards build` and `validate` start hashing the table files under their inputs
(`begin`) before they import Polars, on a background thread and a core the imports leave
idle; `sha256_of` then takes that digest when the file is unchanged since (same size, mtime
and inode). While the imports run, the head start hashes 32 MiB memory maps, one `hashlib`
call (one GIL release) each: `hashlib.file_digest`, which `sha256_of` uses otherwise,
releases the GIL for each 256 KiB chunk and must win it back for the next, so beside an
import (which holds the GIL but for short switches) it barely moves. It waits while the
build decodes (`paused`), and the build asks for the digests only when its plan is done.
At 32k samples a build took 1.16 s without the head start, 1.10 s with it (10 rounds
interleaved; docs/performance.md). Polars maps its input files into memory the same way.

Standard library only: the command line imports it before anything heavy.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import stat
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path

# What the readers take (pipeline.io.readers.TABLE_SUFFIXES) and miles dumps.
SUFFIXES = (".parquet", ".arrow", ".feather", ".jsonl", ".pt")
Identity = tuple[int, int, int]  # size, mtime, inode

# By absolute path: the file's identity when its early digest began, and the digest.
_early: dict[str, tuple[Identity, Future[str]]] = {}
# Paths whose digest a caller took on itself while the head start still walked.
_claimed: set[str] = set()
_walking = False
CHUNK = 32 << 20
BUFFER = 4 << 20
# Set by the program once its heavy imports are done (`pipeline.cli`).
imported = threading.Event()
# Set while no read holds the head start (`paused`).
_resumed = threading.Event()
_resumed.set()
_lock = threading.Lock()
_readers = 0


def _hash(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _hash_mapped(path: Path) -> str:
    """`_hash` for the head start, 32 MiB at a time, waiting between chunks while a read
    holds the head start (`paused`). While the program still imports (which holds the GIL
    but for short switches) a chunk is a memory map hashed in one `hashlib` call, one GIL
    release; afterwards it is read into a 4 MiB buffer at a time, which takes a fifth less
    CPU (0.43 against 0.52 cpu-s for 585 MiB: a map walks 4 KiB pages one by one)."""
    with open(path, "rb", buffering=0) as handle:
        size = os.fstat(handle.fileno()).st_size  # a regular file: see `_identity`
        digest, buffer = hashlib.sha256(), bytearray(BUFFER)
        for start in range(0, size, CHUNK):
            _resumed.wait()
            length = min(CHUNK, size - start)
            if not imported.is_set():
                # one chunk mapped at a time: the pages a paused digest has read do not
                # stay mapped (and counted in the peak RSS) while the build decodes
                with mmap.mmap(handle.fileno(), length, prot=mmap.PROT_READ, offset=start) as m:
                    digest.update(m)
                continue
            with memoryview(buffer) as view:
                offset, end = start, start + length
                while offset < end:
                    read = os.preadv(handle.fileno(), [view[: min(BUFFER, end - offset)]], offset)
                    if not read:  # the file shrank: its identity no longer matches
                        raise OSError(f"{path} shrank while it was hashed")
                    digest.update(view[:read])
                    offset += read
        return digest.hexdigest()


@contextmanager
def paused() -> Iterator[None]:
    """Hold the head start between chunks while the block runs: a build's read, whose
    decoders want both cores. The digests carry on in the phases after it, validation and
    the plan, which leave a core idle. Nothing in the block may wait for an early digest."""
    global _readers
    with _lock:
        _readers += 1
        _resumed.clear()
    try:
        yield
    finally:
        with _lock:
            _readers -= 1
            if not _readers:
                _resumed.set()


def _identity(path: Path) -> Identity | None:
    """Size, mtime and inode of a regular file; None for anything else (a FIFO would
    block the thread that opens it) or a file that is gone."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    return (info.st_size, info.st_mtime_ns, info.st_ino)


def sha256_of(path: Path) -> str:
    """The hex sha256 of the file's bytes: the early digest (`begin`) when the file is
    unchanged since it began, else hashed now. An early digest serves one caller; a file
    the head start has not reached yet is hashed here, and the head start then skips it."""
    key = os.path.abspath(path)
    with _lock:
        early = _early.pop(key, None)
        if early is None and _walking:
            _claimed.add(key)
    if early is not None:
        began, future = early
        if began == _identity(path):
            return future.result()
    return _hash(path)


def table_files(inputs: Sequence[str | Path]) -> Iterator[Path]:
    """The files under `inputs` a build may read, in a stable order: the inputs that are
    such files, and those under input folders (hidden entries left out)."""
    for raw in inputs:
        root = Path(raw)
        if root.is_file():
            if root.suffix in SUFFIXES:
                yield root
            continue
        for folder, subfolders, names in os.walk(root):
            subfolders[:] = sorted(d for d in subfolders if not d.startswith("."))
            for name in sorted(names):
                if name.endswith(SUFFIXES) and not name.startswith("."):
                    yield Path(folder, name)


def _hash_ahead(inputs: Sequence[str | Path]) -> None:
    global _walking
    try:
        for path in table_files(inputs):
            key, identity = os.path.abspath(path), _identity(path)
            future: Future[str] = Future()
            with _lock:
                if identity is None or key in _early or key in _claimed:
                    continue
                future.set_running_or_notify_cancel()
                _early[key] = (identity, future)
            try:
                future.set_result(_hash_mapped(path))
            except BaseException as exc:  # noqa: BLE001 - the caller that waits sees it
                future.set_exception(exc)
    finally:
        with _lock:
            _walking = False
            _claimed.clear()


def begin(inputs: Sequence[str | Path]) -> threading.Thread:
    """Hash the table files under `inputs` one after another on a background thread,
    which also finds them (a tree of many files takes the main thread no time). A digest
    nobody asks for costs only that thread's time."""
    global _walking
    with _lock:
        _walking = True
    thread = threading.Thread(target=_hash_ahead, args=(list(inputs),), daemon=True)
    thread.name = "checksums"
    thread.start()
    return thread

"""Work a build does on other threads: the only place of the core, the writer's rank
threads aside (`pipeline.step.write`), that starts any.

- `HeadStart`: `rollout-shards build` and `validate` hash their input files while the
  program loads, before Polars: loading is single-threaded, and a core it leaves idle takes
  the sha256 the read would otherwise take beside its decoders (bench/results/).
- `read_pool`: the read's threads (`pipeline.io.load`): a file's sha256 taken while its
  columns decode, and a Parquet file's list columns decoded side by side (hashlib and
  Polars let the GIL go).

It imports the standard library only: the head start begins before Polars loads.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import stat
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

# The table files a build reads (pipeline.io.discovery.TABLE_SUFFIXES, which loads Polars).
TABLE_SUFFIXES = (".parquet", ".arrow", ".feather", ".jsonl")
Identity = tuple[int, int, int, int]
Digest = Future[tuple[Identity, str] | None]
# A file's early digest by path, if one was begun (`HeadStart.digest`).
EarlyDigests = Callable[[Path], Digest | None]


def _identity(info: os.stat_result) -> Identity:
    return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _table_files(inputs: Sequence[str]) -> Iterator[Path]:
    """The table files under `inputs` in path order (hidden names left out, as the build
    leaves them), the inputs that are such files first."""
    for raw in inputs:
        root = Path(raw)
        if root.suffix in TABLE_SUFFIXES and root.is_file():
            yield root
            continue
        for folder, subfolders, names in os.walk(root):
            subfolders[:] = sorted(d for d in subfolders if not d.startswith((".", "_")))
            for name in sorted(names):
                if name.endswith(TABLE_SUFFIXES) and not name.startswith((".", "_")):
                    yield Path(folder, name)


# Bytes of a file mapped at once while it is hashed (a multiple of the mapping granularity).
HASH_WINDOW = 64 << 20


def _sha256(path: Path) -> tuple[Identity, str] | None:
    """The file's identity and sha256; None unless a regular file whose identity (inode,
    size, modification and change times) stayed the same while it was hashed."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO would block the thread
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            return None
        digest = hashlib.sha256()
        # Mapped (as Polars reads it) and hashed a window per call: no copy, and the GIL let
        # go once per window, where reads in pieces would win it back from the imports each
        # time; a window is unmapped once hashed, so a big step's file is never resident
        # whole in this process.
        for offset in range(0, before.st_size, HASH_WINDOW):
            length = min(HASH_WINDOW, before.st_size - offset)
            with mmap.mmap(fd, length, prot=mmap.PROT_READ, offset=offset) as mapped:
                digest.update(mapped)
    finally:
        os.close(fd)
    same = _identity(os.stat(path)) == _identity(before)
    return (_identity(before), digest.hexdigest()) if same else None


class HeadStart:
    """The sha256 of a build's table files, taken on a thread from before Polars loads
    until the program has loaded (`loaded`); the file it is on then is finished, the others
    are left to the read. The read takes a digest only for the file as it was hashed (same
    identity), so a file changed in between is hashed again (`pipeline.io.load`)."""

    def __init__(self, inputs: Sequence[str]) -> None:
        self._lock = threading.Lock()
        self._begun: dict[str, Digest] = {}
        self._loaded = False
        self._thread = threading.Thread(target=self._hash_files, args=(list(inputs),), daemon=True)
        self._thread.start()

    def loaded(self) -> None:
        """The program has loaded: begin no further file."""
        with self._lock:
            self._loaded = True

    def digest(self, path: Path) -> Digest | None:
        """The digest of `path` (`EarlyDigests`), if one was begun."""
        with self._lock:
            return self._begun.get(os.path.abspath(path))

    def _hash_files(self, inputs: list[str]) -> None:
        try:
            self._hash_each(_table_files(inputs))
        except Exception:  # noqa: BLE001 - a folder it cannot walk: the build reports it
            return

    def _hash_each(self, paths: Iterator[Path]) -> None:
        for path in paths:
            digest: Digest = Future()
            with self._lock:
                if self._loaded:
                    return
                self._begun[os.path.abspath(path)] = digest
            digest.set_running_or_notify_cancel()
            try:
                digest.set_result(_sha256(path))
            except Exception:  # noqa: BLE001 - the read hashes it and reports what is wrong
                digest.set_result(None)


def read_pool(threads: int) -> ThreadPoolExecutor:
    """A pool for one read's threads (`pipeline.io.load`), closed by its `with`."""
    return ThreadPoolExecutor(max_workers=threads)

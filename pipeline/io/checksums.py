"""The sha256 of a file's bytes (outputs, and inputs where only their digest is wanted:
the rerun check and the sensor). A build's readers hash the very bytes they parse
(`pipeline.io.load`)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from pipeline.io import storage
from pipeline.io.regular import open_regular
from pipeline.io.storage import ObjectPath


def sha256_of(path: Path) -> str:
    """The hex sha256 of the file's bytes; an OSError unless a regular file (`open_regular`:
    a FIFO or a device is never read)."""
    with open_regular(path) as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def input_digest(path: Path) -> str:
    """The sha256 of an input file, or `unreadable: <reason>` for one that cannot be read
    (a dangling symlink, a file gone or locked): such a step is never current, and its
    build names the file (`unreadable_file`) while the other steps go on."""
    try:
        if isinstance(path, ObjectPath):  # an input in an object store: one GET
            return hashlib.sha256(storage.fetch(path)).hexdigest()
        return sha256_of(path)
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"

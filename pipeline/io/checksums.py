"""The sha256 of a file's bytes (outputs, and inputs where only their digest is wanted:
the rerun check and the sensor). A build's readers hash the very bytes they parse
(`pipeline.io.load`)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_of(path: Path) -> str:
    """The hex sha256 of the file's bytes."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()

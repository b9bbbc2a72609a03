"""Finding a step's files: the step folder held open, each file opened relative to it.

What a read takes is one build's: the step folder is opened once and every file is opened
relative to that open folder (a symlink is refused), so a rebuild that swaps the folder
(pipeline/io/writer.py replaces it whole by one rename) cannot mix two builds into one
read: the files come from the folder that was opened, or are gone (the old folder deleted
under the reader), and then the read starts over on the new folder (`Replaced`).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"


class ShardVerificationError(ValueError):
    """A file of a step folder is not what the step's manifest says it wrote: another
    build's or a changed file, a manifest of another step or of another shape, or a path
    that leaves the folder. The message names the file."""


class Replaced(Exception):
    """The step folder was replaced while it was read: read it again."""


def rank_name(rank: int) -> str:
    """The file name of a rank's shard."""
    return f"rank={rank}.parquet"


def identity(info: os.stat_result) -> tuple[int, int]:
    return info.st_dev, info.st_ino


class Folder:
    """A step folder held open: files are opened relative to it, never through a link."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        self.identity = identity(os.fstat(self.fd))

    def close(self) -> None:
        os.close(self.fd)

    def replaced(self) -> bool:
        """Whether the folder's path now names another folder (or none)."""
        try:
            return identity(os.stat(self.path)) != self.identity
        except FileNotFoundError:
            return True

    def open(self, name: str) -> tuple[int, os.stat_result]:
        """An open descriptor of the file `name` of this folder and its status; a symlink,
        a non-regular file or a name with a path in it is refused, a file gone because
        the folder was replaced means `Replaced`."""
        path = self.path / name
        if "/" in name or name in (".", ".."):
            raise ShardVerificationError(f"{path}: a name outside the step folder")
        try:
            # O_NONBLOCK: a FIFO in the folder must not hang the reader (no effect on files)
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
            fd = os.open(name, flags, dir_fd=self.fd)
        except FileNotFoundError:
            if self.replaced():
                raise Replaced from None
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


def open_folder(path: Path) -> Folder:
    """The step folder `path` held open; FileNotFoundError naming it when there is none."""
    try:
        return Folder(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such step folder") from None


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

"""Opening a file that must be a regular file: a settings file, a manifest, a file to hash.

A FIFO put where a file is expected would block a plain `open` until some writer comes, a
character device (`/dev/zero`) would be read without end, and a socket cannot be opened at
all. Here the file is opened without blocking and checked before a byte is read; anything
but a regular file (a symbolic link to one is fine) is an OSError naming what it is, which
callers already turn into their own line (a usage error, a manifest counted as none).
"""

from __future__ import annotations

import errno
import io
import os
import stat
from pathlib import Path

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def kind_of(mode: int) -> str:
    """What a file of `mode` is, in words ("a FIFO")."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "a file" if stat.S_ISREG(mode) else "not a file"


class NotRegularFile(OSError):
    """A path that names something other than a regular file."""

    def __init__(self, path: str | os.PathLike[str], what: str) -> None:
        super().__init__(errno.EINVAL, f"not a regular file ({what})", os.fspath(path))


def open_regular(path: str | os.PathLike[str]) -> io.BufferedReader:
    """`path` open for reading, once it is known to be a regular file; NotRegularFile
    (an OSError) otherwise, and any other OSError of the open as it is."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket (or a FIFO on some systems)
            try:
                raise NotRegularFile(path, kind_of(os.stat(path).st_mode)) from None
            except FileNotFoundError:
                pass
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegularFile(path, kind_of(mode))
    return os.fdopen(fd, "rb")


def read_regular(path: str | os.PathLike[str]) -> bytes:
    """The bytes of the regular file `path` (`open_regular`)."""
    with open_regular(path) as handle:
        return handle.read()


def read_regular_text(path: Path) -> str:
    """The UTF-8 text of the regular file `path`; UnicodeDecodeError for other bytes."""
    return read_regular(path).decode()

"""The command line's output streams and signals: what the program prints is for the user,
and losing it never stops a build.

A reader that goes away (`rollout-shards build ... | head -1`), a closed stream
(`build ... >&-`) or a full device (`> /dev/full`) makes a write fail; a build then goes on,
commits every valid step and exits with the status its steps give, without a traceback.
Interrupting a build (Ctrl-C, SIGINT) ends it as SIGTERM does: at once, by the signal,
leaving only whole step folders (and private leftovers the next build removes).
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
from collections.abc import Iterator
from typing import NoReturn, TextIO


class KeptStream(io.TextIOBase):
    """A text stream whose writes never fail: once the underlying stream refuses one, the
    rest of the output is dropped (and its file descriptor pointed at /dev/null, so that
    what the stream still buffers is flushed there, not into an error at exit)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.lost = False

    def write(self, text: str) -> int:
        if not self.lost:
            try:
                self.stream.write(text)
            except (OSError, ValueError):
                self._lose()
        return len(text)

    def flush(self) -> None:
        if not self.lost:
            try:
                self.stream.flush()
            except (OSError, ValueError):
                self._lose()

    def isatty(self) -> bool:
        try:
            return not self.lost and self.stream.isatty()
        except (OSError, ValueError):
            return False

    def fileno(self) -> int:
        return self.stream.fileno()

    def _lose(self) -> None:
        self.lost = True
        with contextlib.suppress(OSError, ValueError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self.stream.fileno())
            os.close(null)


def _reopen_closed_descriptors() -> None:
    """Standard input, output and error started closed get /dev/null: otherwise the first
    file the build opens would take descriptor 1 or 2, and text meant for a stream would
    land in a shard."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            opened = os.open(os.devnull, os.O_RDWR)
            if opened != fd:  # a lower descriptor was free after all
                os.dup2(opened, fd)
                os.close(opened)


def _stream(current: TextIO | None, fd: int) -> TextIO:
    if current is not None:
        return current
    return open(fd, "w", closefd=False)  # noqa: SIM115 - lives as long as the program


@contextlib.contextmanager
def kept_streams() -> Iterator[None]:
    """sys.stdout and sys.stderr as KeptStreams while the block runs."""
    saved = sys.stdout, sys.stderr
    sys.stdout = KeptStream(_stream(sys.stdout, 1))
    sys.stderr = KeptStream(_stream(sys.stderr, 2))
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = saved


def program_streams_and_signals() -> None:
    """What the program (not a caller of `main`) sets up first: closed standard streams
    reopened on /dev/null, and SIGINT ending the process (`end_on_interrupt`)."""
    _reopen_closed_descriptors()
    end_on_interrupt()


def end_on_interrupt() -> None:
    """SIGINT ends the process at once, as SIGTERM does: Python's default raises
    KeyboardInterrupt wherever the main thread happens to be (a traceback, and cleanup
    code half run), and Polars' own handler, which its import installs, lets a build
    waiting for a step's lock go on waiting. Called again once Polars is loaded."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def exit_now(status: int) -> NoReturn:
    """End the program without the interpreter's teardown (freeing every frame and module
    takes a tenth of a second or more after a big step). By now every step folder is
    committed and fsynced and every thread pool of the stages is joined (the head start
    may still be on a file no step read); only the output streams may hold text, and they
    are flushed first (`streams.KeptStream`: a stream that went away drops it)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)

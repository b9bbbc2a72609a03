"""The atomic step writer: rank shards, quarantine and manifest, committed by one rename.

A build writes a step into its own staging folder beside the step folders, named
`.tmp-step=<N>-<host>-<pid>-<random>`: dot-prefixed, so a trainer listing `step=*` never
sees it. Every file and the folder are fsynced, the manifest last, then the folder is
renamed to `step=<N>`. When `step=<N>` already exists the two are swapped in one system
call (Linux renameat2 with RENAME_EXCHANGE) and the old folder, now under the staging
name, is deleted. A reader therefore sees the old step or the new one, never a mix, and a
SIGKILL at any moment leaves at most a dot-prefixed folder, which the next build on the
same host deletes once the process that made it is gone (`clean_stale`).

Builds of one step hold its lock (`step_lock`) from the freshness check to the commit, so
they publish in the order they read their inputs. A step's set-aside rows go to
`<root>/_quarantine/step=<N>.parquet`, renamed into place just before the step folder is
swapped in, and removed after it when a rebuild sets none aside. Where renameat2 is
missing (not Linux) the old folder is first renamed aside to `.old-step=<N>-...`, which
opens a moment with no `step=<N>`: a reader then finds the step missing, never partial.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import errno
import fcntl
import hashlib
import os
import re
import shutil
import socket
import sys
import uuid
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl

from pipeline import columns as c
from pipeline.errors import StepError, Violation
from pipeline.io.checksums import sha256_of
from pipeline.manifest import OutputFile
from pipeline.speed import Later

# The file of set-aside rows in staging folders. A committed step's quarantine lives outside
# the rank-file tree (`quarantine_path`), so a reader of the whole output root sees only
# training rows: pyarrow, Ray and Spark skip folders whose name starts with `_`.
QUARANTINE = "quarantine.parquet"
QUARANTINE_FOLDER = "_quarantine"
# Per-step lock files: builds of one step publish one after another (`step_lock`).
LOCK_FOLDER = ".locks"
# Rank files are written once and read whole by a trainer. zstd level 1 costs more CPU to
# write than lz4 but makes token files markedly smaller, where higher levels cost far more
# time for little. Groups of 1024 rows let a reader decode a rank file's groups in parallel
# at no cost in size or writing time. Min/max statistics serve no reader that reads every
# row.
ROW_GROUP = 1024
PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 1,
    "statistics": False,
    "row_group_size": ROW_GROUP,
}
RENAME_EXCHANGE = 2
AT_FDCWD = -100
# A private folder of one build process: `.tmp-` while written, `.old-` once retired.
PRIVATE = re.compile(
    r"^\.(?:tmp|old)-(?P<name>.+)-(?P<host>[^-]+)-(?P<pid>[0-9]{1,10})-[0-9a-f]{8}$"
)
# Process ids are positive and fit a C `pid_t`; a name carrying another number is no
# build's folder, and cleaning leaves it alone.
PID_LIMIT = 2**31
# Bounds the retries when other builds keep replacing the same step folder.
COMMIT_ATTEMPTS = 8


def step_folder(out_root: Path, step: int) -> Path:
    return out_root / f"step={step}"


def rank_file(rank: int) -> str:
    return f"rank={rank}.parquet"


def quarantine_path(out_root: Path, step: int) -> Path:
    """Where a committed step's set-aside rows are: `<root>/_quarantine/step=<N>.parquet`."""
    return out_root / QUARANTINE_FOLDER / f"step={step}.parquet"


def quarantine_output(step: int) -> str:
    """The quarantine's path as the manifest lists it, relative to the step folder."""
    return f"../{QUARANTINE_FOLDER}/step={step}.parquet"


@contextmanager
def step_lock(out_root: Path, step: int) -> Iterator[None]:
    """Hold the lock of one step of an output root while a build decides whether the step
    is current, reads its inputs and publishes it. Builds of one step therefore publish in
    the order they read their inputs: the last one published read the newest inputs, and a
    slow build of older inputs never replaces a newer step. The lock is `flock` on a file
    under `<root>/.locks/`: the kernel frees it when the process dies; it serializes builds
    on one host (and on file systems whose `flock` reaches every host). An output root
    that a failed build created holds nothing afterwards and is removed."""
    created = not out_root.exists()
    folder = out_root / LOCK_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with open(folder / f"step={step}.lock", "a+b") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    except BaseException:
        if created:
            _remove_if_only_locks(out_root)
        raise


@contextmanager
def card_lock(out_root: Path) -> Iterator[None]:
    """Hold the lock of the output root's dataset card (`.locks/README.md.lock`): a build
    reads the card, writes the next one and commits its step under it, so that the card's
    build id follows every commit in the order they happen."""
    folder = out_root / LOCK_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "README.md.lock", "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        yield


def _remove_if_only_locks(out_root: Path) -> None:
    """Remove an output root that holds nothing but its lock files (racing builds that
    wrote something in it meanwhile keep it)."""
    try:
        if {entry.name for entry in out_root.iterdir()} != {LOCK_FOLDER}:
            return
        for lock in (out_root / LOCK_FOLDER).iterdir():
            lock.unlink()
        (out_root / LOCK_FOLDER).rmdir()
        out_root.rmdir()
    except OSError:
        pass


def fsync_folder(path: Path) -> None:
    """Make a rename into `path` durable."""
    _fsync(path)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "localhost"


def private_name(kind: str, name: str) -> str:
    """A dot-prefixed name for one process's folder beside `name`, which `clean_stale`
    removes once that process is gone."""
    return f".{kind}-{name}-{_host()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


# The private folders and files this process holds in output roots right now: what an
# interrupt removes before the process ends (`remove_held`), so that a Ctrl-C leaves an
# output root as it was. A SIGKILL leaves them to the next build (`clean_stale`).
_HELD: set[Path] = set()


def hold(path: Path) -> None:
    """`path` (a private folder or file about to be made) is this process's until released."""
    _HELD.add(path)


def release(path: Path) -> None:
    _HELD.discard(path)


def remove_held() -> None:
    """Remove every private folder and file this process holds (an interrupt ends it)."""
    for path in list(_HELD):
        for _ in range(3):  # a writer thread may still add a file as the folder goes
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    path.unlink(missing_ok=True)
            if not os.path.lexists(path):
                break
        _HELD.discard(path)


# While > 0, the step is being published (its quarantine moved into place, its folder
# swapped in): an interrupt waits for the end of the commit (`commit_section`), so a step
# is published whole or not at all.
_committing = [0]
_deferred: list[Callable[[], None]] = []


@contextmanager
def commit_section() -> Iterator[None]:
    _committing[0] += 1
    try:
        yield
    finally:
        _committing[0] -= 1
        if not _committing[0] and _deferred:
            _deferred.pop()()


def when_not_committing(end: Callable[[], None]) -> None:
    """Run `end` now, or once the commit under way is done."""
    if _committing[0]:
        _deferred.append(end)
    else:
        end()


def _gone(pid: int) -> bool:
    """Whether no process has the id `pid` (a process id out of range is not known gone)."""
    if not 0 < pid < PID_LIMIT:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's process, or a kernel that will not say
        return False
    return False


def clean_stale(out_root: Path) -> list[Path]:
    """Delete the private folders (and files) that builds on this host left when they were killed
    (their process is gone); folders of live builds and of other hosts stay."""
    try:
        entries = sorted(out_root.iterdir())
    except FileNotFoundError:
        return []
    host, removed = _host(), []
    for entry in entries:
        match = PRIVATE.match(entry.name)
        if match and match["host"] == host and _gone(int(match["pid"])):
            try:
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:  # a dataset card's temporary file
                    entry.unlink(missing_ok=True)
            except OSError:  # not ours to remove after all: left as it is
                continue
            removed.append(entry)
    return removed


def _exchange(a: Path, b: Path) -> bool | None:
    """Atomically swap two paths (Linux renameat2). False when `b` vanished meanwhile,
    None where the system cannot swap."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
    renameat2.argtypes += [ctypes.c_uint]
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code == errno.ENOENT:
        return False
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return None
    raise OSError(code, os.strerror(code), str(b))


def commit_folder(staged: Path, final: Path) -> None:
    """Move a complete staged folder to its final name; an existing folder is swapped out
    in one step, so a reader sees the old folder or the new one, never a mix."""
    _fsync(staged)
    for _ in range(COMMIT_ATTEMPTS):
        try:
            os.rename(staged, final)
            break
        except OSError as error:
            if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        swapped = _exchange(staged, final)
        if swapped:
            shutil.rmtree(staged, ignore_errors=True)
            break
        if swapped is None:
            retired = final.with_name(private_name("old", final.name))
            try:
                os.rename(final, retired)
            except FileNotFoundError:
                continue
            shutil.rmtree(retired, ignore_errors=True)
    else:
        raise OSError(errno.EBUSY, f"other builds keep replacing {final}; {staged} is kept")
    _fsync(final.parent)


def replace_folder(final: Path, fill: Callable[[Path], None]) -> None:
    """Fill a fresh hidden sibling of `final`, then swap it in (`commit_folder`): a reader
    sees the old folder or the new one. What killed builds of this host left beside it is
    removed first; on any failure the sibling is removed and `final` is left as it was."""
    if final.exists() and not final.is_dir():
        # Swapping a folder with a plain file would publish the folder and bury the file.
        message = f"{final} is a file, not a step folder: move it away to build this step"
        raise StepError([Violation("output_not_a_folder", message, files=[str(final)])])
    final.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(final.parent)
    staged = final.parent / private_name("tmp", final.name)
    hold(staged)
    staged.mkdir()
    try:
        fill(staged)
        with commit_section():
            commit_folder(staged, final)
            release(staged)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    finally:
        release(staged)


_OS_ERROR = re.compile(r"\(os error (\d+)\)")
# Polars' word for an I/O failure while it writes a Parquet footer (thrift's transport)
_LOST_IO_ERROR = "Invalid thrift: transport error"


def write_staged(frame: pl.DataFrame, path: Path, **options: Any) -> None:
    """`frame.write_parquet(path)`, with an I/O failure raised as the OSError it is:
    Polars reports a full disk as "parquet: File out of specification: underlying IO
    error: No space left on device (os error 28)"."""
    try:
        frame.write_parquet(path, **options)
    except pl.exceptions.PolarsError as exc:
        code = _OS_ERROR.search(str(exc))
        if code is not None:
            number = int(code.group(1))
            raise OSError(number, os.strerror(number), str(path)) from None
        if _LOST_IO_ERROR in str(exc):
            # a file small enough to sit in the writer's buffer first fails in the footer,
            # where Polars loses the OS error: the write failed, its cause unnamed
            raise OSError(errno.EIO, f"the write failed ({_LOST_IO_ERROR})", str(path)) from None
        raise


def write_parquet(frame: pl.DataFrame, path: Path) -> None:
    """Write `frame` to `path` with the shards' Parquet options; `seal` makes it durable
    and gives its digest. Polars writes the file itself, without the GIL. Encoding into a
    Python buffer instead would hand every chunk through the GIL and grow the buffer by
    reallocation."""
    write_staged(frame, path, **PARQUET_OPTIONS)


# Bytes of a file hashed per step of `sealing`: a small read is hashed while it is in the
# processor's cache.
SEAL_WINDOW = 256 << 10


def seal(path: Path) -> str:
    """The sha256 of a written file's bytes, read from its pages in the page cache, never
    from disk; then the file is fsynced."""
    return Later(sealing(path)).result()


def sealing(path: Path) -> Generator[None, None, str]:
    """`seal` in steps (a window of bytes hashed each): a job of `speed.Background`."""
    try:
        with open(path, "rb", buffering=0) as handle:
            digest = hashlib.sha256()
            window = memoryview(bytearray(SEAL_WINDOW))
            while read := handle.readinto(window):
                digest.update(window[:read])
                yield
            os.fsync(handle.fileno())
    except OSError as exc:  # fsync names no file: name the one that was not stored
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    return digest.hexdigest()


def raw_reward_sha256(frame: pl.DataFrame) -> str:
    """The digest of a rank file's `batch_position` and `raw_reward` values, from the frame
    written to it: sha256 over `batch_position` as int64 little-endian, then `raw_reward`
    as float64 little-endian (a null as 0.0), then one byte per row, 1 where `raw_reward`
    is set, all in row order. The loader computes it again from the two columns it reads
    of another rank's file (rollout_shards_loader/_verify.py), so those reads need not hash
    the whole file; both sides must keep this layout."""
    positions = frame.get_column(c.BATCH_POSITION).cast(pl.Int64)
    rewards = frame.get_column(c.RAW_REWARD).cast(pl.Float64)
    # The standard library's arrays, not numpy: a build without the rollout-side schedule
    # never loads numpy (its import is a good part of a small step's fixed cost).
    digest = hashlib.sha256()
    for kind, values in (
        ("q", positions.to_list()),
        ("d", rewards.fill_null(0.0).to_list()),
        ("B", rewards.is_not_null().cast(pl.UInt8).to_list()),
    ):
        packed = array.array(kind, values)
        if sys.byteorder == "big":
            packed.byteswap()
        digest.update(packed.tobytes())
    return digest.hexdigest()


def file_record(
    path: Path,
    name: str,
    rows: int,
    tokens: int | None = None,
    sha256: str | None = None,
    raw_reward_sha256: str | None = None,
) -> OutputFile:
    """The manifest's record of a written file; its sha256 read back from disk unless the
    writer gave it."""
    return OutputFile(
        path=name,
        sha256=sha256 or sha256_of(path),
        rows=rows,
        tokens=tokens,
        raw_reward_sha256=raw_reward_sha256,
    )


def write_text_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text` by one rename of a fsynced file beside it (a private
    name per process and call, so concurrent writers never share a temporary file)."""
    staged = path.with_name(f".tmp-{path.name}-{_host()}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    hold(staged)
    try:
        with open(staged, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(staged, path)
    except OSError as exc:  # a failed write names no file: name the one being written
        raise OSError(exc.errno, exc.strerror, exc.filename or str(path)) from None
    finally:
        staged.unlink(missing_ok=True)
        release(staged)

"""Every speed trick of a build, in one module, each behind one switch.

A build is correct without any of them: each trades threads, memory or start-up for time,
and stays only where `bench/ab.py` shows, on an idle machine, that it pays (the A/B runs
are in bench/results/). `ROLLOUT_SHARDS_OFF` turns switches off for a process, as a comma
list or `all`, so one tree can be measured against itself
(`bench/ab.py STEP --tree on=. --tree off=. --env off:ROLLOUT_SHARDS_OFF=head_start`).

- `head_start`: `build` and `validate` hash their input files on a thread while the
  program loads (`HeadStart`): loading is single-threaded and leaves a core idle.
- `read_threads`: a file's sha256 is taken while its columns decode, a large Parquet
  file's list columns decode side by side (`thread_pool`, `io.parquet`), and a read in
  parts types and spills a part while the next decodes (`step.readers.spill`).
- `write_threads`: two ranks gathered and encoded at once, and each written file sealed
  (sha256, fsync, footer) on other threads while the next ranks are written.
- `background`: those sealing threads run at the lowest priority (`Background`), on the
  cores the writers leave idle; what is left when the writers are done is sealed at the
  build's own priority.
- `arrow_pool`: a read in parts has Arrow's pool give back its freed pages when the read
  ends (`returning_arrow_pool`).
- `small_writes`: a read in parts writes its spill in writes of `SMALL_WRITE` bytes
  (`step.readers.spill`), where Polars would hand the kernel a whole buffer at once.
- `process`: the programs that build (the CLI, the Pipes worker) give Polars' allocator one
  arena whose freed pages are kept a while, and OpenBLAS one thread (`tune_process`).

It imports the standard library only: the head start begins before Polars loads, and
importing it changes nothing global (only `tune_process`, which a program calls, does).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import sys
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Generic, TypeVar

OFF_ENV = "ROLLOUT_SHARDS_OFF"
SWITCHES = (
    "head_start",
    "read_threads",
    "write_threads",
    "background",
    "arrow_pool",
    "small_writes",
    "process",
)


def on(switch: str) -> bool:
    """Whether the trick `switch` (one of `SWITCHES`) is on in this process."""
    assert switch in SWITCHES, switch
    off = {name.strip() for name in os.environ.get(OFF_ENV, "").split(",")}
    return switch not in off and "all" not in off


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


# Bytes of a file read at once while it is hashed.
HASH_WINDOW = 8 << 20


def _sha256(path: Path) -> tuple[Identity, str] | None:
    """The file's identity and sha256; None unless a regular file whose identity (inode,
    size, modification and change times) stayed the same while it was hashed."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO would block the thread
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            return None
        digest = hashlib.sha256()
        # Read into one buffer and hashed a window per call: the GIL let go twice per window
        # (the read, the hash), where small reads would win it back from the imports each
        # time. Never mapped: a file truncated by another process while mapped kills the
        # process with SIGBUS; a read of it is only short (and the identity check fails).
        window = memoryview(bytearray(HASH_WINDOW))
        while read := os.readv(fd, [window]):
            digest.update(window[:read])
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


def thread_pool(threads: int) -> ThreadPoolExecutor:
    """A pool of `threads` threads, closed by its `with`: the one way the core starts
    threads (a read's decoders and digest, the writer's ranks and sealers)."""
    return ThreadPoolExecutor(max_workers=threads)


def read_threads() -> int:
    """Threads of one file's read: its decoders and its digest (1: all on the caller's)."""
    return max(2, os.cpu_count() or 1) if on("read_threads") else 1


def write_threads() -> tuple[int, int]:
    """Ranks written at once, and threads sealing written files (0: sealed by the writer)."""
    return (2, 2) if on("write_threads") else (1, 0)


def one_at_a_time() -> contextlib.AbstractContextManager[bool]:
    """A lock for work the writer's threads take in turns (a rank's gather from the spill)."""
    return threading.Lock()


T = TypeVar("T")
# The nice value of `Background`'s threads: the lowest priority there is.
BACKGROUND_NICE = 19


class Later(Generic[T]):
    """A job of `Background`: a generator whose steps run one at a time, on a background
    thread or on the thread that waits for its value (`result`)."""

    def __init__(self, steps: Generator[None, None, T]) -> None:
        self._steps = steps
        self._lock = threading.Lock()  # held while a step runs
        self._claimed = False  # a waiting thread runs the rest: no background step begins
        self._done = False
        self._value: T | None = None
        self._error: BaseException | None = None

    def _step(self) -> None:
        """One step; the caller holds the lock and the job is not done."""
        try:
            next(self._steps)
        except StopIteration as stop:
            self._value, self._done = stop.value, True
        except BaseException as exc:  # noqa: BLE001 - raised again by `result`
            self._error, self._done = exc, True

    def result(self) -> T:
        """The job's value (or its error), its steps left run on this thread, at its own
        priority, once the one running (if any) is done."""
        self._claimed = True
        with self._lock:
            while not self._done:
                self._step()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    def cancel(self) -> None:
        """Stop the job where it is (its generator closed: its files closed)."""
        self._claimed = True
        with self._lock:
            if not self._done:
                self._done = True
                self._steps.close()


class Background:
    """`threads` threads of the lowest priority (nice `BACKGROUND_NICE`) running jobs whose
    value is wanted only later (a written rank file's seal): they take the cores the
    build's own threads leave idle instead of sharing them. A job waited for is finished
    by the waiting thread, at its priority: on a machine busy with other programs a
    nice-19 thread gets almost no time. With 0 threads `submit` runs a job to its end
    before it returns; with the `background` switch off the threads have the build's
    priority. Closed by its `with`: jobs not waited for are cancelled."""

    def __init__(self, threads: int) -> None:
        self._ready = threading.Condition()
        self._queue: deque[Later[object]] = deque()
        self._jobs: list[Later[object]] = []
        self._closed = False
        self._threads = [threading.Thread(target=self._work, daemon=True) for _ in range(threads)]
        for thread in self._threads:
            thread.start()

    def __enter__(self) -> Background:
        return self

    def __exit__(self, *raised: object) -> None:
        with self._ready:
            self._closed = True
            self._queue.clear()
            self._ready.notify_all()
        for job in self._jobs:
            job.cancel()
        for thread in self._threads:
            thread.join()

    def submit(self, steps: Generator[None, None, T]) -> Later[T]:
        job: Later[T] = Later(steps)
        if not self._threads:
            with job._lock:  # its error is raised by `result`
                while not job._done:
                    job._step()
            return job
        with self._ready:
            self._jobs.append(job)  # type: ignore[arg-type]
            self._queue.append(job)  # type: ignore[arg-type]
            self._ready.notify()
        return job

    def _work(self) -> None:
        if on("background") and sys.platform.startswith("linux"):
            # Linux gives each thread a nice value of its own (elsewhere the call would
            # renice a process)
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
        while True:
            with self._ready:
                while not self._queue and not self._closed:
                    self._ready.wait()
                if self._closed:
                    return
                job = self._queue.popleft()
            while True:
                with job._lock:
                    if job._claimed or job._done:
                        break
                    job._step()


@contextlib.contextmanager
def returning_arrow_pool() -> Iterator[None]:
    """When the block ends, Arrow's default pool gives the operating system back the pages
    freed while it ran (`release_unused`). Its pool (mimalloc) keeps a decoding thread's
    freed pages for that thread's next part, so each part decodes into the pages the part
    before freed instead of faulting in new ones; the release keeps the rest of the build
    from carrying them (Polars has an allocator of its own). Arrow's jemalloc pool faults
    in every part anew (its arenas decay freed pages within a second) and gives back
    nothing when asked."""
    if not on("arrow_pool"):
        yield
        return
    import pyarrow as pa

    try:
        yield
    finally:
        pa.default_memory_pool().release_unused()


# A write(2) of many bytes makes the page cache take large folios for the file (Linux 6.x),
# and where the kernel returns free memory to a hypervisor (free page reporting) those come
# from the blocks it returned, each page of which the host must back again; a write of this
# many bytes takes small folios, from pages the machine still holds.
SMALL_WRITE = 64 << 10


class SmallWrites:
    """A file, for `pyarrow.PythonFile`, that hands the OS at most `SMALL_WRITE` bytes per
    write(2) (see `SMALL_WRITE`); it neither opens nor closes `fd`."""

    closed = False

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data).cast("B")
        size = len(view)
        while view:
            view = view[os.write(self.fd, view[:SMALL_WRITE]) :]
        return size

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


ALLOCATOR_ENV = "_RJEM_MALLOC_CONF"
# one arena for every thread and size, so a rank's gathered lists reuse the pages the read
# and earlier ranks freed; freed pages kept long enough to outlast validation and the plan
ALLOCATOR_CONF = "dirty_decay_ms:2000,muzzy_decay_ms:0,narenas:1,oversize_threshold:0"
BLAS_THREADS_ENV = "OPENBLAS_NUM_THREADS"


def tune_process() -> None:
    """Set Polars' allocator and numpy's OpenBLAS threads for this process, before either
    loads (a value the user set is kept). Called by the programs that build, never on
    import: a trainer or a notebook that imports `pipeline` keeps its own. OpenBLAS starts
    a spinning thread per core when numpy loads, which competes with Polars' decoders, and
    the package calls no BLAS routine."""
    if not on("process"):
        return
    if "polars" not in sys.modules:
        os.environ.setdefault(ALLOCATOR_ENV, ALLOCATOR_CONF)
    if "numpy" not in sys.modules:
        os.environ.setdefault(BLAS_THREADS_ENV, "1")

"""Every speed trick is behind one switch (`pipeline.speed`), and none changes a byte."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pipeline import speed
from tests.support.samples import REPO, generated_step


def _build(inputs: Path, out: Path, off: str | None) -> dict[str, bytes]:
    """A whole `rollout-shards build` process (the head start and process settings are the
    program's), with `off` switched off; every written file by name."""
    env = {"PATH": "/usr/bin:/bin"} | ({speed.OFF_ENV: off} if off is not None else {})
    command = [sys.executable, "-m", "pipeline.cli", "build", str(inputs), "--out", str(out)]
    flags = ["--global-batch-size", "64", "--dp-size", "4", "--stream-above", "1"]
    subprocess.run([*command, *flags], cwd=REPO, env=env, check=True, capture_output=True)
    return {
        str(path.relative_to(out)): path.read_bytes()
        for path in sorted(out.rglob("*"))
        if path.is_file() and ".locks" not in path.parts
    }


def test_each_switch_turned_off_gives_the_same_bytes(tmp_path: Path) -> None:
    inputs = generated_step(tmp_path / "in", samples=6000)
    assert (inputs / "step=0.parquet").stat().st_size > 1 << 20  # read in parts too
    small = generated_step(tmp_path / "small", samples=600)
    for folder in (inputs, small):
        expected = _build(folder, tmp_path / "on" / folder.name, None)
        assert "step=0/rank=3.parquet" in expected
        for off in (*speed.SWITCHES, "all"):
            assert _build(folder, tmp_path / off / folder.name, off) == expected, off


@pytest.mark.parametrize("value", ["", "head_start", " all", "process, arrow_pool"])
def test_the_switches_read_the_environment(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(speed.OFF_ENV, value)
    off = {name.strip() for name in value.split(",")}
    for switch in speed.SWITCHES:
        assert speed.on(switch) is not (switch in off or "all" in off)
    assert speed.read_threads() == (1 if "all" in off else max(2, os.cpu_count() or 1))


def _anonymous_mib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) >> 10
    raise AssertionError("no RssAnon in /proc/self/status")


def test_the_read_gives_the_pages_arrow_freed_back_when_it_ends() -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    one = pa.array(np.ones(1 << 17, dtype=np.int64))  # 1 MiB
    with speed.returning_arrow_pool():
        parts = [pc.add(one, i) for i in range(96)]  # decoded parts, from Arrow's pool
        assert pa.default_memory_pool().bytes_allocated() >= 96 << 20
        del parts
        held = _anonymous_mib()  # freed, and kept by the pool for its next allocations
    assert held - _anonymous_mib() >= 64


def _steps(
    log: list[tuple[str, int]], name: str, count: int, gate: threading.Event | None = None
) -> Generator[None, None, str]:
    """A `Background` job of `count` steps logging the thread of each; it waits for `gate`
    before its second step, and returns its name."""
    for step in range(count):
        if step == 1 and gate is not None:
            assert gate.wait(timeout=60)
        log.append((name, threading.get_native_id()))
        yield
    return name


def _within(seconds: float, wait: Callable[[], str]) -> str:
    """`wait()` on another thread, failing the test if it takes longer than `seconds`."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(wait).result(timeout=seconds)


def test_background_threads_run_at_the_lowest_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    def nice() -> Generator[None, None, int]:
        yield
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    ours = os.getpriority(os.PRIO_PROCESS, 0)
    for off, expected in (("", speed.BACKGROUND_NICE), ("background", ours)):
        monkeypatch.setenv(speed.OFF_ENV, off)
        with speed.Background(1) as background:
            job = background.submit(nice())
            deadline = time.monotonic() + 60
            while not job._done and time.monotonic() < deadline:  # run by the thread
                time.sleep(0.01)
            assert job.result() == expected


def test_a_job_waited_for_is_finished_by_the_thread_that_waits() -> None:
    log: list[tuple[str, int]] = []
    gate = threading.Event()
    with speed.Background(1) as background:
        first = background.submit(_steps(log, "first", 4, gate))
        second = background.submit(_steps(log, "second", 3))
        deadline = time.monotonic() + 60
        while not log and time.monotonic() < deadline:
            time.sleep(0.01)
        # the background thread has taken the first job's first step and waits at the
        # gate: the second job, never begun, is run whole by the thread that waits for it
        assert _within(60, second.result) == "second"
        waiter = [thread for name, thread in log if name == "second"]
        assert len(waiter) == 3 and len(set(waiter)) == 1
        gate.set()
        assert first.result() == "first"
    threads = [thread for name, thread in log if name == "first"]
    assert len(threads) == 4 and waiter[0] not in threads[:1]
    assert set(threads) <= {threads[0], threading.get_native_id()}


def test_a_job_s_error_is_raised_where_it_is_waited_for() -> None:
    def failing() -> Generator[None, None, None]:
        yield
        raise OSError(28, "No space left on device", "rank=0.parquet")

    for threads in (0, 2):
        with speed.Background(threads) as background:
            job = background.submit(failing())
            with pytest.raises(OSError, match="No space left"):
                job.result()


def test_jobs_not_waited_for_are_closed_when_the_background_closes() -> None:
    closed: list[str] = []

    def endless() -> Generator[None, None, None]:
        try:
            while True:
                time.sleep(0.001)
                yield
        finally:
            closed.append("endless")

    with speed.Background(2) as background:
        background.submit(endless())
        background.submit(endless())
        time.sleep(0.05)
    assert closed == ["endless", "endless"]

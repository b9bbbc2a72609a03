"""The step pool held strictly on one machine: lock files that bound the sessions even when
Dagster's claim on SQLite storage lets runs that start together through."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import dagster as dg
import pytest

from pipeline.errors import UsageError
from pipeline.orchestration.step_pool import STEP_POOL, held_slot, lock_folder
from tests.support.dagster_roots import Roots, materialize, most_at_once

ROOT = Path(__file__).resolve().parents[2]

# A process that says it is ready, reads the moment to start from stdin, holds a slot of
# `limit` for `hold` seconds and prints its span; or, with hold < 0, prints "held" and holds
# the slot until it is killed.
HOLDER = """
import json, sys, time
from pathlib import Path
from pipeline.orchestration.step_pool import held_slot
folder, limit, hold = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
if hold >= 0:
    print("ready", flush=True)
    start = float(sys.stdin.readline())
    while time.time() < start:
        time.sleep(0.001)
with held_slot(folder, limit, lambda: None):
    began = time.monotonic()
    if hold < 0:
        print("held", flush=True)
        time.sleep(3600)
    time.sleep(hold)
    ended = time.monotonic()
print(json.dumps([began, ended]), flush=True)
"""


def _holder(folder: Path, limit: int, hold: float) -> subprocess.Popen[str]:
    command = [sys.executable, "-c", HOLDER, str(folder), str(limit), str(hold)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )


def test_processes_that_start_together_hold_at_most_the_limit(tmp_path: Path) -> None:
    holders = [_holder(tmp_path / "pool", 2, 0.6) for _ in range(5)]
    for holder in holders:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
    start = time.time() + 0.2
    for holder in holders:  # every holder told before any is waited for
        assert holder.stdin is not None
        holder.stdin.write(f"{start}\n")
        holder.stdin.close()
    spans = [tuple(json.loads(holder.stdout.read())) for holder in holders if holder.stdout]
    for holder in holders:
        holder.wait(timeout=60)
    assert all(holder.returncode == 0 for holder in holders)
    assert len(spans) == 5
    assert most_at_once(spans) == 2  # never three, and two do run side by side


def test_a_killed_holder_frees_its_slot(tmp_path: Path) -> None:
    holder = _holder(tmp_path / "pool", 1, -1)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    waits: list[float] = []
    released = threading.Event()

    def take() -> None:
        with held_slot(tmp_path / "pool", 1, lambda: waits.append(time.monotonic())):
            released.set()

    taker = threading.Thread(target=take)
    taker.start()
    time.sleep(0.5)
    assert not released.is_set() and len(waits) == 1  # waiting, told once
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    taker.join(timeout=10)
    assert released.is_set()


def test_a_file_where_the_lock_folder_belongs_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "pool").write_text("")
    with pytest.raises(UsageError, match=r"^pool pool: cannot open .*slot-0\.lock: "):
        with held_slot(tmp_path / "pool", 2, lambda: None):
            pass


def test_the_step_waits_for_a_slot_held_on_this_machine(
    instance: dg.DagsterInstance, roots: Roots
) -> None:
    """Dagster grants the step its pool slot; the lock file of that slot is held (as by a
    session Dagster's racy claim let through), so the step waits until it is released."""
    instance.event_log_storage.set_concurrency_slots(STEP_POOL, 1)
    folder = lock_folder(instance)
    holding = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with held_slot(folder, 1, lambda: None):
            holding.set()
            release.wait(timeout=60)

    waiting = f"waiting for one of the 1 slots of pool {STEP_POOL}"
    seen_waiting = threading.Event()

    def release_once_waiting() -> None:
        """Release the slot once the run has logged that it waits for it (or after 60 s,
        and then the assertions below fail): however long Dagster takes to start the step,
        the step finds the slot held."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not seen_waiting.is_set():
            for run in instance.get_runs():
                if any(entry.user_message == waiting for entry in instance.all_logs(run.run_id)):
                    seen_waiting.set()
            time.sleep(0.05)
        time.sleep(0.2)  # the step is still waiting when the slot comes free
        release.set()

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(timeout=10)
    releaser = threading.Thread(target=release_once_waiting)
    releaser.start()
    result = materialize(instance, "00000001")
    holder.join()
    releaser.join()
    assert result.success
    assert seen_waiting.is_set()
    messages = [entry.user_message for entry in instance.all_logs(result.run_id)]
    assert messages.index(waiting) < messages.index("step 1: 16 rows read, 16 valid, 0 repaired")
    assert (roots.output / "step=1" / "manifest.json").is_file()


def test_an_unlimited_pool_takes_no_lock(instance: dg.DagsterInstance, roots: Roots) -> None:
    assert materialize(instance, "00000001").success
    assert not lock_folder(instance).exists()

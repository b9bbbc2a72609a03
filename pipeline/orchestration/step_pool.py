"""The step pool held strictly on one machine.

The multi-asset's `pool=` makes Dagster claim one slot of `STEP_POOL` before the step
starts. On SQLite storage (`dagster dev`, a DAGSTER_HOME without storage config) that claim
is a count, then a write, then a select of a free slot row, then an update, each in its own
statement: runs that claim at the same moment can all get through (seen: more runs holding
slots than the pool's limit, and a backfill running more pods than it allowed).

So the step also takes one of `limit` lock files under the instance's root with `flock`,
which the kernel grants atomically and frees when the process dies, before its session
starts, and holds it until the session ends. Runs on one machine (Dagster's default run
launcher) are then never more than the pool's limit. Runs on other machines (a run launcher
that starts each run in a pod) share no lock folder; for them the pool's claim is the bound.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import UsageError, first_line

if TYPE_CHECKING:
    import dagster as dg

STEP_POOL = "rollout_step_sessions"
POLL_S = 0.1


def pool_limit(instance: dg.DagsterInstance, pool: str = STEP_POOL) -> int | None:
    """The pool's limit on this instance, None when the pool is unlimited."""
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return None
    limits = {limit.name: limit.limit for limit in storage.get_pool_limits()}
    return limits.get(pool)


def lock_folder(instance: dg.DagsterInstance, pool: str = STEP_POOL) -> Path:
    return Path(instance.root_directory) / ".pool_slots" / pool


@contextmanager
def held_slot(folder: Path, limit: int, on_wait: Callable[[], None]) -> Iterator[int]:
    """Hold one of `limit` slots (lock files in `folder`) until the block ends, waiting
    for one to free; `on_wait` is called once if none is free at first. Yields the slot."""
    waited = False
    while True:
        for slot in range(limit):
            path = folder / f"slot-{slot}.lock"
            try:
                folder.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise UsageError(
                    f"pool {folder.name}: cannot open {path}: {first_line(exc)}"
                ) from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield slot
            finally:
                os.close(fd)  # closing the only descriptor releases the lock
            return
        if not waited:
            on_wait()
            waited = True
        time.sleep(POLL_S)


@contextmanager
def step_slot(context: dg.AssetExecutionContext) -> Iterator[None]:
    """Hold a slot of `STEP_POOL` on this machine while the step's session runs."""
    limit = pool_limit(context.instance)
    if limit is None:
        yield
        return

    def waiting() -> None:
        context.log.info(f"waiting for one of the {limit} slots of pool {STEP_POOL}")

    with held_slot(lock_folder(context.instance), limit, waiting):
        yield

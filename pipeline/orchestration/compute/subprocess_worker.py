"""`compute: subprocess`: the Pipes worker as a child process on this machine.

The command is `python .../pipeline/orchestration/pipes_worker.py`, this process's own copy of
the worker by its path, in a Pipes session of its own (`dg.open_pipes_session`) that hands
each asset to Dagster as the worker reports it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Generator
from typing import Any

import dagster as dg

from pipeline.errors import UsageError
from pipeline.orchestration.compute.pipes_session import Reported
from pipeline.orchestration.pipes_worker import WORKER_FILE

# How often the session looks for results the worker reported, and how long an interrupted
# worker gets to stop after SIGINT before it is killed.
RESULT_POLL_SECONDS = 0.02
TERMINATION_SECONDS = 20.0


def worker_command(python: str | None) -> list[str]:
    """The worker run by its path under `python` (unset: this interpreter)."""
    return [python or sys.executable, WORKER_FILE]


def subprocess_session(
    context: dg.AssetExecutionContext, step: int, extras: dict[str, Any], command: list[str]
) -> Generator[dg.MaterializeResult, None, list[Any]]:
    """The worker as a child process in one Pipes session, each materialization handed to
    Dagster as soon as the worker reports it (so the UI shows `rollout_samples` while the
    step is still being written, and Dagster stores the first assets meanwhile instead of
    after the worker exits); returns the worker's custom messages. An interrupted run (or
    a step abandoned for any reason) stops the worker with SIGINT, then SIGKILL."""
    with dg.open_pipes_session(
        context=context,
        context_injector=dg.PipesTempFileContextInjector(),
        message_reader=dg.PipesTempFileMessageReader(),
        extras=extras,
    ) as session:
        reported = Reported(session)
        env = {**os.environ, **session.get_bootstrap_env_vars()}
        try:
            process = subprocess.Popen(command, env=env)
        except OSError as exc:
            raise UsageError(f"compute subprocess: cannot start {command[0]}: {exc}") from exc
        try:
            while process.poll() is None:
                yield from reported.new()
                try:
                    process.wait(RESULT_POLL_SECONDS)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            if process.poll() is None:
                context.log.info(f"[pipes] step {step} interrupted: stopping its worker")
                _stop(process)
        if process.returncode != 0:
            raise dg.Failure(
                description=f"step {step}: the Pipes worker (pid {process.pid}) exited "
                f"with code {process.returncode}; its output is in the step's logs"
            )
    # The session is closed: every message the worker wrote has been read.
    yield from reported.new()
    return list(session.get_custom_messages())


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGINT (the worker's Pipes session closes), then SIGKILL if it outlives the grace."""
    process.send_signal(signal.SIGINT)
    try:
        process.wait(TERMINATION_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()

"""A step read and written by Ray tasks on a running cluster: a step larger than one node
(docs/scaling-out.md).

`RayTasks` runs the tasks of `pipeline.step.shares` on the cluster: a task per share of the
input files reads, types, checks and reduces its rows and hands the driver their per-row
scalars; a task per rank reads its rows' lists again from the input files and writes and
seals its file. The driver (`build.run_step`, through `route`) plans and commits; it never
holds a per-token list. The files are byte-identical to the in-process build's.

Ray is imported here and nowhere else in `pipeline` (the `ray` extra); the CLI and the
Dagster backends reach this module through `ray_route` only when a cluster is named.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import ray
import ray.exceptions

from pipeline.errors import StepError, UsageError, Violation
from pipeline.step.build import StepJob
from pipeline.step.shares import Call, by_tasks

# Ray runs a task again when its worker dies; a step's tasks are not retried, so a dead
# worker fails the step (nothing published) and the next build starts it afresh.
MAX_RETRIES = 0


@dataclass(frozen=True)
class Ran:
    """Where one task ran: its function, the Ray node, the host and the worker's process."""

    task: str
    node: str
    host: str
    pid: int


def _run_call(function: Callable[..., Any], arguments: tuple[Any, ...]) -> tuple[Any, Ran]:
    """The Ray task: one call, and where it ran."""
    node = ray.get_runtime_context().get_node_id()
    where = Ran(function.__name__, node, socket.gethostname(), os.getpid())
    return function(*arguments), where


@dataclass
class RayTasks:
    """`shares.Tasks` on a Ray cluster: each call a task reserving `num_cpus` (and any
    custom `resources`, to keep the tasks on some nodes); the calls fail, nothing
    published, when they have not all finished `timeout_s` seconds after they were
    submitted (None: no bound)."""

    num_cpus: float = 1.0
    resources: dict[str, float] = field(default_factory=dict)
    timeout_s: float | None = None
    ran: list[Ran] = field(default_factory=list)  # where each task ran, in call order

    def run(self, calls: Sequence[Call]) -> list[Any]:
        task = ray.remote(_run_call).options(
            num_cpus=self.num_cpus, resources=self.resources or None, max_retries=MAX_RETRIES
        )
        refs = [task.remote(function, arguments) for function, arguments in calls]
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        results = []
        try:
            for ref, (function, _) in zip(refs, calls, strict=True):
                left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                try:
                    result, where = ray.get(ref, timeout=left)
                except ray.exceptions.RayTaskError as error:
                    raise _cause(error) from None
                except ray.exceptions.GetTimeoutError:
                    raise _failed(f"Ray tasks did not finish in {self.timeout_s} s") from None
                except ray.exceptions.RayError as error:
                    # a worker or node that died, an object that was lost
                    what = f"a Ray task ({function.__name__}) failed: {type(error).__name__}"
                    raise _failed(what) from None
                results.append(result)
                self.ran.append(where)
        except BaseException:
            # only the tasks still running or waiting; cancelling one whose reply is on its
            # way trips Ray's own bookkeeping
            _, running = ray.wait(refs, num_returns=len(refs), timeout=0)
            for ref in running:
                ray.cancel(ref)
            raise
        return results


def _failed(what: str) -> StepError:
    message = f"{what}; nothing was published: build the step again"
    return StepError([Violation(rule="ray_tasks", message=message)])


def _cause(error: ray.exceptions.RayTaskError) -> BaseException:
    """The exception a task raised, as the in-process build raises it: a bad file or row
    (StepError), a setting (UsageError) or a machine's fault (OSError) in one line."""
    cause = error.cause
    if isinstance(cause, StepError | UsageError | OSError):
        return cause
    return _failed(f"a Ray task failed: {type(cause).__name__}: {cause}")


def route(tasks: RayTasks) -> Callable[[StepJob], StepJob]:
    """The route of a step to `tasks` (`ray_route` decides which steps take it)."""

    def routed(job: StepJob) -> StepJob:
        return by_tasks(job, tasks)  # type: ignore[no-any-return]

    return routed


def _reachable(address: str | None) -> None:
    """A GCS address (`host:port`) that does not answer is a usage error now: Ray's own
    connect waits minutes for it."""
    text = address or ""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or "://" in text:
        return
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except OSError as error:
        raise UsageError(
            f"cannot reach the Ray cluster at {address} ({error.strerror or error}): give the "
            "GCS address of a running head (head:6379, what `ray start --address` takes)"
        ) from None


@contextmanager
def connected(
    address: str | None,
    tasks: RayTasks | None = None,
    node_ip_address: str | None = None,
    keep: bool = False,
) -> Iterator[Any]:
    """The route to the cluster at `address` (its GCS, `head:6379`, or `auto`; None: the
    cluster this process runs in, a Ray job's), connected for as long as it is used, or
    for the process's life (`keep`); a process already connected keeps its connection.
    `node_ip_address`: this node's address as the cluster knows it (a cluster bound to the
    loopback interface)."""
    ours = not ray.is_initialized()
    if ours:
        _reachable(address)
        options: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}
        if node_ip_address is not None:
            options["_node_ip_address"] = node_ip_address
        try:
            ray.init(address=address, **options)
        except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as error:
            raise UsageError(f"cannot connect to the Ray cluster at {address}: {error}") from None
    try:
        yield route(tasks or RayTasks())
    finally:
        if ours and not keep:
            ray.shutdown()

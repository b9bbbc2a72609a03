"""A step read and written by Ray tasks on a running cluster: a step larger than one node
(docs/scaling-out.md).

`RayTasks` runs the tasks of `pipeline.step.readers.shares` on the cluster: a task per share
of the input files reads, types, checks and reduces its rows and hands the driver their
per-row scalars; after the plan a task per share splits its rows' lists by rank and a task
per rank gets its pieces (through the object store) and writes and seals its file
(`readers.shuffle`). The driver (`build.run_step`, through `route`) plans and commits; it
never holds a per-token list. The files are byte-identical to the in-process build's.

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
from pipeline.io import storage
from pipeline.step.build import StepJob
from pipeline.step.readers import shares
from pipeline.step.readers.shares import Call, by_tasks

# Ray runs a task again when its worker dies; a step's tasks are not retried, so a dead
# worker fails the step (nothing published) and the next build starts it afresh.
MAX_RETRIES = 0


@dataclass(frozen=True)
class Ran:
    """Where one task ran: its function, the Ray node, the host and the worker's process;
    what it cost there: the process's CPU seconds and the bytes of typed rows it decoded
    from input files (`shares.DECODED`)."""

    task: str
    node: str
    host: str
    pid: int
    cpu_s: float = 0.0
    decoded: int = 0


def _call(function: Callable[..., Any], arguments: tuple[Any, ...]) -> tuple[Any, Ran]:
    node = ray.get_runtime_context().get_node_id()
    cpu, decoded = time.process_time(), shares.DECODED[0]
    result = function(*arguments)
    cost = (time.process_time() - cpu, shares.DECODED[0] - decoded)
    return result, Ran(function.__name__, node, socket.gethostname(), os.getpid(), *cost)


def _run_call(function: Callable[..., Any], *arguments: Any) -> tuple[Any, Ran]:
    """The Ray task: one call, and where it ran. The arguments come one by one, so Ray
    hands the task the piece an object reference among them names (`scatter`)."""
    return _call(function, arguments)


def _run_split(function: Callable[..., Any], *arguments: Any) -> list[Any]:
    """The Ray task of a call returning pieces: each piece a return value of its own (kept
    in the object store, owned by the driver), and where it ran last."""
    pieces, where = _call(function, arguments)
    return [*pieces, where]


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
        refs = [task.remote(function, *arguments) for function, arguments in calls]
        return self._get(refs, [function for function, _ in calls])

    def scatter(self, calls: Sequence[tuple[Call, int]]) -> list[list[Any]]:
        """A task per call, each of its `ways` pieces a return value of its own: the driver
        waits for each task's `Ran` alone and hands back the references of the pieces,
        which it never fetches."""
        task = ray.remote(_run_split)
        options = {"num_cpus": self.num_cpus, "resources": self.resources or None}
        submitted = [
            task.options(**options, max_retries=MAX_RETRIES, num_returns=ways + 1).remote(
                function, *arguments
            )
            for (function, arguments), ways in calls
        ]
        self._get([refs[-1] for refs in submitted], [function for (function, _), _ in calls])
        return [refs[:-1] for refs in submitted]

    def _get(self, refs: list[Any], functions: list[Callable[..., Any]]) -> list[Any]:
        """Each task's result in call order, and where it ran (`ran`)."""
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        results = []
        try:
            for ref, function in zip(refs, functions, strict=True):
                left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                try:
                    got = ray.get(ref, timeout=left)
                    result, where = (None, got) if isinstance(got, Ran) else got
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


# The bounds of the probe of a GCS before Ray's own connect, which waits minutes.
CONNECT_TIMEOUT_S = 10.0
ANSWER_TIMEOUT_S = 5.0
# An HTTP/2 client's connection preface and an empty SETTINGS frame (RFC 9113 section 3.4):
# the GCS, a gRPC server, answers with its own SETTINGS at once; a TLS GCS answers with an
# alert or closes; a port that accepts and then stays silent is no GCS.
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_HEAD = "give the GCS address of a running head (head:6379, what `ray start --address` takes)"


def _reachable(address: str | None) -> None:
    """A GCS address (`host:port`) that refuses, or accepts and does not answer, is a usage
    error within CONNECT_TIMEOUT_S + ANSWER_TIMEOUT_S: Ray's own connect waits minutes."""
    text = address or ""
    host, _, port = text.rpartition(":")
    if not host or not port.isascii() or not port.isdigit() or "://" in text:
        return
    host = host.removeprefix("[").removesuffix("]")
    try:
        probe = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S)
    except OSError as error:
        reason = "timed out" if isinstance(error, TimeoutError) else error.strerror or error
        raise UsageError(f"cannot reach the Ray cluster at {address} ({reason}): {_HEAD}") from None
    with probe:
        try:
            probe.settimeout(ANSWER_TIMEOUT_S)
            probe.sendall(_PREFACE)
            probe.recv(1)  # a frame, an alert or the end of the stream: someone answered
        except TimeoutError:
            raise UsageError(
                f"the Ray cluster at {address} did not answer in {ANSWER_TIMEOUT_S:g} s (the "
                f"port accepts connections but is no Ray GCS, or the head is stuck): {_HEAD}"
            ) from None
        except OSError:
            pass  # reset on the preface: something answered; Ray's connect says what


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
        if client := storage.client_environment():
            # a task PUTs an object-store output's files (`store_ranks`) with the driver's
            # endpoint and credentials, not whatever its worker node was started with
            options["runtime_env"] = {"env_vars": client}
        try:
            ray.init(address=address, **options)
        except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as error:
            raise UsageError(f"cannot connect to the Ray cluster at {address}: {error}") from None
    try:
        yield route(tasks or RayTasks())
    finally:
        if ours and not keep:
            ray.shutdown()

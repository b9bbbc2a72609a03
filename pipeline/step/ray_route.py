"""Whether a run builds its steps with Ray tasks, decided without importing Ray.

The CLI (`--ray ADDRESS`, the setting `ray_address`) and the Dagster backends (`compute:
ray`, whose Pipes worker runs in a Ray job, or a run config naming `ray_address`) ask here;
Ray itself (`ray_ranks`) is imported only when a cluster is named. Which steps go to the
cluster is the `ray_above` setting's, the same for every caller (`ray_ranks.route`).
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING

from pipeline.errors import UsageError

if TYPE_CHECKING:
    from pipeline.io.discovery import SourceFile
    from pipeline.settings import RowSettings, Settings
    from pipeline.step.build import StepJob

Route = Callable[["StepJob"], "StepJob"]

# What `ray.init(address=...)` takes: `auto`, `local`, or a GCS `host:port` (a Ray Client's
# `ray://host:port`), the port in ASCII digits: Ray waits minutes on `head:+6379` or
# `head:６３７９` rather than refuse them.
_ADDRESS = re.compile(r"(?:ray://)?(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(?P<port>[0-9]{1,5})")
INSTALL_RAY = "pip install 'rollout-shards[ray]'"


def check_address(address: str) -> None:
    """A usage error unless `address` has the shape of a Ray cluster's address."""
    match = _ADDRESS.fullmatch(address)
    if address in ("auto", "local") or (match and 0 < int(match["port"]) < 1 << 16):
        return
    raise UsageError(
        f"invalid settings: ray_address: {address!r} is not a Ray cluster's "
        "address: give its GCS as host:port (the port 1 to 65535, digits only), "
        "ray://host:port or auto"
    )


def check_ray_installed() -> None:
    """A usage error naming the extra when Ray is not importable here."""
    try:
        found = importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise UsageError(f"--ray (ray_address) needs Ray, which is not installed: {INSTALL_RAY}")


def _object_bytes(sources: Sequence[SourceFile]) -> int:
    """The bytes of the step's objects in a store (one HEAD each), which `input_bytes`,
    reading the disk, counts as none."""
    from pipeline.io.storage import ObjectPath, head_of

    total = 0
    for source in sources:
        if isinstance(source.path, ObjectPath):
            found = head_of(source.path)
            total += found.size if found is not None else 0  # its reader reports it
    return total


@contextmanager
def ray_route(
    settings: Settings | RowSettings | None, in_ray_job: bool = False
) -> Iterator[Route | None]:
    """The route of steps to the cluster the settings name (`ray_address`), or, in a Ray
    job (`in_ray_job`), to the job's own cluster; None when neither. A step whose input
    files take more than `ray_above` MiB goes to the cluster, any other stays here; Ray is
    imported and the cluster joined when the first step goes there. A Ray job's worker
    stays connected to its cluster for the next step it builds (a warm worker)."""
    address = getattr(settings, "ray_address", None)
    if address is None and not in_ray_job:
        yield None
        return
    if address is not None:  # before any step is read
        check_address(address)
        check_ray_installed()
    from pipeline.step.readers.spill import input_bytes

    with ExitStack() as stack:
        joined: list[Route] = []

        def route(job: StepJob) -> StepJob:
            above = getattr(job.settings, "ray_above", 0) << 20
            if input_bytes(job.sources) + _object_bytes(job.sources) <= above:
                return job
            if not joined:
                try:
                    from pipeline.step import ray_ranks
                except ImportError as error:
                    if (error.name or "").partition(".")[0] != "ray":
                        raise
                    raise UsageError(f"Ray cannot be imported ({error}): {INSTALL_RAY}") from None

                joined.append(stack.enter_context(ray_ranks.connected(address, keep=in_ray_job)))
            return joined[0](job)

        yield route

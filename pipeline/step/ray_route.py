"""Whether a run builds its steps with Ray tasks, decided without importing Ray.

The CLI (`--ray ADDRESS`, the setting `ray_address`) and the Dagster backends (`compute:
ray`, whose Pipes worker runs in a Ray job, or a run config naming `ray_address`) ask here;
Ray itself (`ray_ranks`) is imported only when a cluster is named. Which steps go to the
cluster is the `ray_above` setting's, the same for every caller (`ray_ranks.route`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.settings import RowSettings, Settings
    from pipeline.step.build import StepJob

Route = Callable[["StepJob"], "StepJob"]


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
    from pipeline.step.bounded import input_bytes

    with ExitStack() as stack:
        joined: list[Route] = []

        def route(job: StepJob) -> StepJob:
            above = getattr(job.settings, "ray_above", 0) << 20
            if job.out_root is None or input_bytes(job.sources) <= above:
                return job
            if not joined:
                from pipeline.step import ray_ranks

                joined.append(stack.enter_context(ray_ranks.connected(address, keep=in_ray_job)))
            return joined[0](job)

        yield route

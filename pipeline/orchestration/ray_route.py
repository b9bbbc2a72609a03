"""Whether a run builds its steps with Ray tasks, decided without importing Ray.

The CLI (`--ray ADDRESS`, the setting `ray_address`) and the Dagster backends (`compute:
ray`, whose Pipes worker runs in a Ray job, or a run config naming `ray_address`) ask here;
Ray itself (`ray_ranks`) is imported only when a cluster is named. Which steps go to the
cluster is the `ray_above` setting's, the same for every caller (`ray_ranks.route`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
    job (`in_ray_job`), to the job's own cluster; None (Ray not imported) when neither."""
    address = getattr(settings, "ray_address", None)
    if address is None and not in_ray_job:
        yield None
        return
    from pipeline.orchestration import ray_ranks

    with ray_ranks.connected(address) as route:
        yield route

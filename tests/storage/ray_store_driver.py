"""A driver process of `test_ray_store.py`: for each of its builds, one after another in
one connection to the cluster (one Ray job, so its workers start once), builds every step
of the build's inputs to an object-store output root (`build_step`, which hands it to
`store_commit.build_to_store`) routed to the cluster (`ray_ranks.connected`), each task
asking for the workers' custom resource, and prints what happened as one JSON line.

Run as `python ray_store_driver.py SPEC`, SPEC a JSON object: address, settings and builds,
each inputs, out (an s3:// URL), and optionally die_task and die_rank (the task of that
function for that rank kills its worker process: a worker dying mid-write).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from pipeline.errors import StepError
from pipeline.io.discovery import find_sources
from pipeline.io.load import group_steps
from pipeline.io.storage import listing, root_of
from pipeline.settings import Settings
from pipeline.step import ray_ranks
from pipeline.step.build import build_step

RESOURCE = "rollout_worker"


def _die(*_: Any) -> None:
    os._exit(1)  # the worker process dies as a killed or crashed one does


def _rank(function: Any, arguments: tuple[Any, ...]) -> int:
    """The rank a rank task works for: its second argument, or the rank file it PUTs."""
    if function.__name__ == "put_object":
        return int(str(arguments[1]).rpartition("rank=")[2].partition(".")[0] or -1)
    return int(arguments[1])


class DyingTasks(ray_ranks.RayTasks):
    """Tasks whose `die_task` of one rank (`die_rank`) dies."""

    die_task = ""
    die_rank = -1

    def _swap(self, function: Any, arguments: tuple[Any, ...]) -> Any:
        if function.__name__ == self.die_task and _rank(function, arguments) == self.die_rank:
            return _die
        return function

    def run(self, calls: Any) -> list[Any]:
        return super().run([(self._swap(f, a), a) for f, a in calls])

    def scatter(self, calls: Any) -> list[list[Any]]:
        return super().scatter([((self._swap(f, a), a), ways) for (f, a), ways in calls])


def _build(route: Any, tasks: DyingTasks, settings: Settings, build: dict[str, Any]) -> Any:
    """One build's steps: the tasks it ran, its error (None: built) and the keys its root
    holds right after it."""
    tasks.die_task, tasks.die_rank = build.get("die_task", ""), build.get("die_rank", -1)
    first = len(tasks.ran)
    root = root_of(build["out"])
    error = None
    for step, files in group_steps(find_sources([Path(build["inputs"])])).items():
        try:
            build_step(step, files, settings, root, route=route)  # type: ignore[arg-type]
        except StepError as failed:
            error = str(failed)
    left = [listed.key for listed in listing(root, "")]  # type: ignore[arg-type]
    ran = [[r.task, r.node, r.pid] for r in tasks.ran[first:]]
    return {"ran": ran, "error": error, "left": left}


def main(spec: dict[str, Any]) -> dict[str, Any]:
    import ray

    tasks = DyingTasks(resources={RESOURCE: 1})
    settings = Settings(**spec["settings"])
    with ray_ranks.connected(spec["address"], tasks, node_ip_address="127.0.0.1") as route:
        driver = ray.get_runtime_context().get_node_id()
        builds = [_build(route, tasks, settings, build) for build in spec["builds"]]
    return {"driver": driver, "builds": builds}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))

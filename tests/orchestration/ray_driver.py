"""A driver process of the Ray tests (`test_ray_ranks.py`): builds every step of the inputs
of each of its builds, one after another in one connection to the cluster (one Ray job, so
its workers start once), with `build_step` routed to the cluster (`ray_ranks.connected`),
each task asking for the workers' custom resource, and prints what happened as one JSON line.

Run as `python ray_driver.py SPEC`, SPEC a JSON object: address and builds, each inputs,
out, settings, and optionally share_bytes (smaller shares) and die_rank (the task writing
that rank kills its worker process: a worker dying mid-step); or address and validate
(`validate`).
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
from pipeline.settings import Settings
from pipeline.step import ray_ranks
from pipeline.step.build import build_step
from pipeline.step.readers import shares

RESOURCE = "rollout_worker"
DEFAULT_SHARE_BYTES = shares.SHARE_BYTES


def _die(*_: Any) -> None:
    os._exit(1)  # the worker process dies as a killed or crashed one does


class DyingTasks(ray_ranks.RayTasks):
    """Tasks whose writer of one rank dies (`die_rank`)."""

    die_rank: int = -1

    def run(self, calls: Any) -> list[Any]:
        calls = [
            (_die, arguments)
            if function.__name__ == "write_rank_pieces" and arguments[1] == self.die_rank
            else (function, arguments)
            for function, arguments in calls
        ]
        return super().run(calls)


class RecordingTasks(ray_ranks.RayTasks):
    """The tasks `--ray` makes (`ray_route`), each instance recorded (`validate`)."""

    made: list[ray_ranks.RayTasks] = []

    def __init__(self) -> None:
        super().__init__(resources={RESOURCE: 1})
        RecordingTasks.made.append(self)


def validate(spec: dict[str, Any]) -> dict[str, Any]:
    """`rollout-shards validate` with each argument list of `validate`, one after another in
    this process, as the command line runs it: per run its exit status, what it printed on
    stdout and on stderr, and the tasks it ran."""
    from contextlib import redirect_stderr, redirect_stdout
    from io import StringIO

    from pipeline.cli import main as cli

    ray_ranks.RayTasks = RecordingTasks  # type: ignore[misc]
    runs = []
    for argv in spec["validate"]:
        RecordingTasks.made.clear()
        out, err = StringIO(), StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            status = cli(["validate", *argv])
        ran = [[r.task, r.node, r.pid] for made in RecordingTasks.made for r in made.ran]
        runs.append(
            {"status": status, "stdout": out.getvalue(), "stderr": err.getvalue(), "ran": ran}
        )
    return {"runs": runs}


def _build(route: Any, tasks: DyingTasks, build: dict[str, Any]) -> dict[str, Any]:
    """One build's steps: the tasks it ran, its error (None: built) and what its output root
    holds right after it (None: no root)."""
    shares.SHARE_BYTES = build.get("share_bytes", DEFAULT_SHARE_BYTES)
    tasks.die_rank = build.get("die_rank", -1)
    first = len(tasks.ran)
    settings = Settings(**build["settings"])
    error = None
    for step, files in group_steps(find_sources([Path(build["inputs"])])).items():
        try:
            build_step(step, files, settings, Path(build["out"]), route=route)
        except StepError as failed:
            error = str(failed)
    out = Path(build["out"])
    left = sorted(p.name for p in out.iterdir()) if out.exists() else None
    return {
        "ran": [[r.task, r.node, r.pid] for r in tasks.ran[first:]],
        "error": error,
        "left": left,
    }


def main(spec: dict[str, Any]) -> dict[str, Any]:
    import ray

    if "validate" in spec:
        return validate(spec)

    tasks = DyingTasks(resources={RESOURCE: 1})
    with ray_ranks.connected(spec["address"], tasks, node_ip_address="127.0.0.1") as route:
        driver = ray.get_runtime_context().get_node_id()
        builds = [_build(route, tasks, build) for build in spec["builds"]]
    return {"driver": driver, "builds": builds}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))

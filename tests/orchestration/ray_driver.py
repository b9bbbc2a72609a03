"""A driver process of the Ray tests (`test_ray_ranks.py`): builds every step of its inputs
with `build_step` routed to the cluster (`ray_ranks.connected`), each task asking for the
workers' custom resource, and prints what happened as one JSON line.

Run as `python ray_driver.py SPEC`, SPEC a JSON object: inputs, out, settings, address,
and optionally share_bytes (smaller shares), die_rank (the task writing that rank kills
its worker process: a worker dying mid-step).
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


def main(spec: dict[str, Any]) -> dict[str, Any]:
    import ray

    if "validate" in spec:
        return validate(spec)

    if "share_bytes" in spec:
        shares.SHARE_BYTES = spec["share_bytes"]
    tasks = DyingTasks(resources={RESOURCE: 1})
    tasks.die_rank = spec.get("die_rank", -1)
    settings = Settings(**spec["settings"])
    error = None
    with ray_ranks.connected(spec["address"], tasks, node_ip_address="127.0.0.1") as route:
        driver = ray.get_runtime_context().get_node_id()
        for step, files in group_steps(find_sources([Path(spec["inputs"])])).items():
            try:
                build_step(step, files, settings, Path(spec["out"]), route=route)
            except StepError as failed:
                error = str(failed)
    io = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return {
        "driver": driver,
        "ran": [[r.task, r.node, r.pid] for r in tasks.ran],
        "error": error,
        "rchar": int(io["rchar"]),
    }


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))

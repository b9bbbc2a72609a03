"""The Dagster Pipes worker: the selected stages of one step, outside the orchestrator.

Launched by the Pipes session of the subprocess or the Ray backend, or by
`dagster_k8s.PipesK8sClient` (see `pipeline.orchestration.compute`), in one of two ways that
a `pipeline/` folder in the working directory or on $PYTHONPATH (Ray puts a job's
`working_dir` first on it) cannot shadow: by this file's absolute path
(`python /.../pipeline/orchestration/pipes_worker.py`, the subprocess backend's), which puts
the folder holding this `pipeline` package first on `sys.path`; or isolated
(`python -I -u -m pipeline.orchestration.pipes_worker`, the Ray default), which finds the
installed package and ignores the working directory and $PYTHONPATH.
It needs only dagster-pipes and the core, not Dagster: the extras name the stages (the
selected assets, usually all three), the step, the roots and the effective settings. The
stages run in this one session, handing the batch on in memory; logs and one
materialization per asset go back through Pipes as each stage finishes. A step that is
invalid (or a setting its data cannot satisfy) is not a crash: the worker reports the
violations as a custom message and exits 0, and the run fails with the same summary as in
process, after the assets whose stages did finish.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    # Run by its path: Python put this file's folder first on sys.path. The folder holding
    # this `pipeline` package takes its place, ahead of $PYTHONPATH and the working
    # directory, so the imports below are of this package and not of a job's own folder.
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from dagster_pipes import open_dagster_pipes  # noqa: E402

from pipeline.cli import exit_now  # noqa: E402
from pipeline.errors import StepError, UsageError, Violation, os_violation  # noqa: E402
from pipeline.settings import Settings, make_settings  # noqa: E402
from pipeline.step.roots import StepRoots  # noqa: E402
from pipeline.step.stages import run_stages  # noqa: E402

FAILURE = "rollout_shards_failure"
# The worker as a file, for `python WORKER_FILE` (see the module's docstring).
WORKER_FILE = str(Path(__file__).resolve())


def worker_extras(
    stages: list[str], roots: StepRoots, step: int, settings: Settings | None
) -> dict[str, Any]:
    """What a worker needs to run `stages` on `step`, as JSON for the Pipes extras."""
    return {
        "stages": stages,
        "step": step,
        "roots": roots.to_json(),
        "settings": settings.to_dict() if settings is not None else None,
    }


def failure_message(error: StepError | UsageError) -> dict[str, Any]:
    if isinstance(error, StepError):
        return {FAILURE: "step", "violations": [asdict(v) for v in error.violations]}
    return {FAILURE: "usage", "message": str(error)}


def reported_failure(messages: list[Any]) -> StepError | UsageError | None:
    """The error a worker reported among its custom messages, rebuilt; None if it reported none."""
    for message in messages:
        if not isinstance(message, dict) or FAILURE not in message:
            continue
        if message[FAILURE] == "usage":
            return UsageError(message["message"])
        violations = [
            Violation(**{**v, "rows": [tuple(row) for row in v["rows"]]})
            for v in message["violations"]
        ]
        return StepError(violations)
    return None


def main() -> int:
    with open_dagster_pipes() as pipes:
        stages = list(pipes.get_extra("stages"))
        step = int(pipes.get_extra("step"))
        roots = StepRoots.from_json(pipes.get_extra("roots"))
        raw_settings = pipes.get_extra("settings")
        settings = make_settings(raw_settings) if raw_settings is not None else None
        names = ", ".join(stages)
        pipes.log.info(f"step {step}: {names} on {socket.gethostname()}, pid {os.getpid()}")
        try:
            for stage, report in run_stages(stages, roots, step, settings):
                pipes.log.info(report.log)
                pipes.report_asset_materialization(metadata=report.metadata, asset_key=stage)
        except (StepError, UsageError) as error:
            pipes.log.error(str(error))
            pipes.report_custom_message(failure_message(error))
        except OSError as exc:  # disk full, permissions: the same one line as in process
            error = StepError([os_violation(exc, roots.output, step)])
            pipes.log.error(str(error))
            pipes.report_custom_message(failure_message(error))
    return 0


if __name__ == "__main__":
    # The Pipes session is closed (its last message written): skip the interpreter's
    # teardown, which the launcher would otherwise wait for before the step succeeds.
    exit_now(main())

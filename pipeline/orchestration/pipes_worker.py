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

import argparse
import gc
import os
import socket
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if __name__ == "__main__" and not __package__:
    # Run by its path: Python put this file's folder first on sys.path. The folder holding
    # this `pipeline` package takes its place, ahead of $PYTHONPATH and the working
    # directory, so the imports below are of this package and not of a job's own folder.
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from dagster_pipes import (  # noqa: E402
    PipesContext,
    PipesDefaultContextLoader,
    PipesDefaultMessageWriter,
    PipesMappingParamsLoader,
    PipesParamsLoader,
    open_dagster_pipes,
)

from pipeline.errors import StepError, UsageError, Violation, os_violation  # noqa: E402
from pipeline.orchestration.ray_jobs import WarmQueue  # noqa: E402
from pipeline.settings import Settings, make_settings  # noqa: E402
from pipeline.speed import tune_process  # noqa: E402
from pipeline.step.ray_route import ray_route  # noqa: E402
from pipeline.streams import exit_now  # noqa: E402

if TYPE_CHECKING:
    from pipeline.step.roots import StepRoots

FAILURE = "rollout_shards_failure"
# How often a warm worker looks for the next step.
SERVE_POLL_S = 0.02
# The worker as a file, for `python WORKER_FILE` (see the module's docstring).
WORKER_FILE = str(Path(__file__).resolve())


def worker_extras(
    stages: list[str],
    roots: StepRoots,
    step: int,
    settings: Settings | None,
    in_ray_job: bool = False,
) -> dict[str, Any]:
    """What a worker needs to run `stages` on `step`, as JSON for the Pipes extras: the
    recorded settings, the run options apart (`stream_above`, `ray_address`, `ray_above`:
    a worker of an earlier release, which knows fewer, builds without them), and whether
    the worker runs in a Ray job (`compute: ray`), whose cluster builds the steps above
    `ray_above`."""
    recorded = settings.to_dict() if settings is not None else None
    options = {
        name: value
        for name, value in (settings.values() if settings is not None else {}).items()
        if recorded is not None and name not in recorded
    }
    return {
        "stages": stages,
        "step": step,
        "roots": roots.to_json(),
        "settings": recorded,
        "run_options": options,
        "in_ray_job": in_ray_job,
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


def run_session(params_loader: PipesParamsLoader | None = None) -> None:
    """One step's Pipes session: its stages, their reports, a failure as a custom message.
    `params_loader` is a warm worker's for each step it takes; `open_dagster_pipes` would
    hand back the process's first (closed) context, so each step gets a context of its own."""
    # Polars and the stages load here, after `main` set the process settings.
    from pipeline.orchestration.stage_reports import stage_report
    from pipeline.step.roots import StepRoots
    from pipeline.step.stages import run_stages

    if params_loader is None:
        session = open_dagster_pipes()
    else:
        session = PipesContext(
            params_loader, PipesDefaultContextLoader(), PipesDefaultMessageWriter()
        )
        PipesContext.set(session)
    with session as pipes:
        stages = list(pipes.get_extra("stages"))
        step = int(pipes.get_extra("step"))
        roots = StepRoots.from_json(pipes.get_extra("roots"))
        raw_settings = pipes.get_extra("settings")
        options = pipes.extras.get("run_options") or {}
        settings = make_settings({**raw_settings, **options}) if raw_settings is not None else None
        names = ", ".join(stages)
        pipes.log.info(f"step {step}: {names} on {socket.gethostname()}, pid {os.getpid()}")
        in_ray_job = bool(pipes.extras.get("in_ray_job"))
        try:
            with ray_route(settings, in_ray_job) as route:
                for stage, done in run_stages(stages, roots, step, settings, route):
                    report = stage_report(done)
                    pipes.log.info(report.log)
                    pipes.report_asset_materialization(metadata=report.metadata, asset_key=stage)
        except (StepError, UsageError) as error:
            pipes.log.error(str(error))
            pipes.report_custom_message(failure_message(error))
        except OSError as exc:  # disk full, permissions: the same one line as in process
            error = StepError([os_violation(exc, roots.output_root, step)])
            pipes.log.error(str(error))
            pipes.report_custom_message(failure_message(error))


def serve(folder: Path, job: str, idle_s: float) -> int:
    """A warm worker (`compute: ray` with `ray.warm_worker_s`): build the steps of the queue
    in `folder` one at a time, each in a Pipes session of its own, until no step has come for
    `idle_s` seconds. The interpreter, its imports and the Ray job around it are paid once
    for every step it builds."""
    queue = WarmQueue(folder)
    idle_since = time.monotonic()
    collected = True
    while True:
        claimed = queue.claim(job)
        if claimed is None:
            if not collected:
                # Cycles left by the last step, collected while no step waits rather than
                # before the next one.
                gc.collect()
                collected = True
            if time.monotonic() - idle_since > idle_s:
                return 0
            time.sleep(SERVE_POLL_S)
            continue
        request, env = claimed
        print(f"{job}: step request {request}", flush=True)
        try:
            run_session(PipesMappingParamsLoader(env))
        finally:
            queue.done(request, job)
        collected = False
        idle_since = time.monotonic()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The Dagster Pipes worker of rollout-shards.")
    parser.add_argument("--serve", type=Path, help="queue folder of a warm worker")
    parser.add_argument("--job", help="the warm worker's Ray submission id")
    parser.add_argument("--idle", type=float, default=0.0, help="seconds to wait for a step")
    args = parser.parse_args(argv)
    tune_process()
    if args.serve is not None:
        return serve(args.serve, args.job, args.idle)
    run_session()
    return 0


if __name__ == "__main__":
    # The Pipes session is closed (its last message written): skip the interpreter's
    # teardown, which the launcher would otherwise wait for before the step succeeds.
    exit_now(main())

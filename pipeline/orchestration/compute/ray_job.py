"""`compute: ray`: the Pipes worker as a Ray job, through the head's Ray Jobs REST API.

The job is submitted and watched through `ray_jobs` (no Ray in the Dagster process), in a
Pipes session of its own that hands each asset to Dagster as the job's log reports it. With
`ray.warm_worker_s`, a warm Ray job builds the steps of a backfill one after another instead
of a job per step (`ray_jobs.WarmQueue`, docs/scaling-out.md). The job reads and writes the
roots by path: they must be on a filesystem mounted at the same path on the workers.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shlex
import time
import uuid
from collections.abc import Generator
from typing import Any

import dagster as dg
from pydantic import Field

from pipeline.errors import UsageError
from pipeline.orchestration.compute.pipes_session import WORKER_MODULE, Reported
from pipeline.orchestration.ray_jobs import (
    SUCCEEDED,
    RayJobs,
    RayJobsError,
    WarmQueue,
    dashboard_url,
)
from pipeline.orchestration.ray_logs import RAY_ADDRESS_KEY, RAY_JOB_ID_KEY, RayJobLogReader
from pipeline.step.roots import StepRoots

# Isolated (-I): the cluster's installed package, whatever the job's working_dir puts on
# $PYTHONPATH or in its working directory (a `pipeline/` folder of its own). -I also drops
# the PYTHONUNBUFFERED that Ray sets, and the Pipes messages must reach the job's log as
# they are written: -u.
RAY_ENTRYPOINT = f"python -I -u -m {WORKER_MODULE}"
# The warm queues' folder under the output root, and how often a step waiting on a warm job
# checks that job's state (or starts one).
WARM_FOLDER = ".ray-workers"
WARM_CHECK_S = 1.0


class RayCompute(dg.Config):
    """The Ray job of `compute: ray`; the cluster must see the roots and have rollout-shards."""

    address: str | None = Field(
        None, description="Ray dashboard address (http://head:8265); unset: $RAY_ADDRESS."
    )
    entrypoint: str = Field(
        RAY_ENTRYPOINT,
        description="Command of the Ray job, run on the cluster (the default finds the "
        "installed rollout-shards, ignoring $PYTHONPATH and the working directory).",
    )
    runtime_env: dict[str, Any] | None = Field(
        None, description="Ray runtime_env of the job (pip, working_dir, env_vars, ...)."
    )
    num_cpus: float | None = Field(None, description="CPUs reserved for the job's entrypoint.")
    memory: int | None = Field(None, description="Memory in bytes reserved for the entrypoint.")
    poll_interval: float = Field(
        0.1, description="Seconds between job status polls and between job log reads."
    )
    headers: dict[str, str] = Field(
        {},
        description="Extra HTTP headers of every call to the dashboard (a proxy's, or an "
        "Authorization of its own instead of Ray's token).",
    )
    ca_bundle: str | None = Field(
        None, description="PEM file or folder of certificates to trust for an https dashboard."
    )
    warm_worker_s: float = Field(
        0.0,
        description="Seconds a Ray job waits for the next step after one, taking the steps of "
        "a backfill as they come (0: one Ray job per step).",
    )
    warm_workers: int = Field(
        1, description="At most this many warm Ray jobs at once (with warm_worker_s)."
    )


def job_submission(ray: RayCompute) -> dict[str, Any]:
    """The job's submission parameters, fresh each time (a session adds the Pipes
    variables to the runtime_env it is given)."""
    params: dict[str, Any] = {"entrypoint": ray.entrypoint}
    if ray.runtime_env is not None:
        params["runtime_env"] = copy.deepcopy(ray.runtime_env)
    if ray.num_cpus is not None:
        params["entrypoint_num_cpus"] = ray.num_cpus
    if ray.memory is not None:
        params["entrypoint_memory"] = ray.memory
    return params


def ray_jobs(ray: RayCompute) -> RayJobs:
    """The client of the cluster's dashboard."""
    return RayJobs(dashboard_url(ray.address), headers=dict(ray.headers), ca_bundle=ray.ca_bundle)


def ray_session(
    context: dg.AssetExecutionContext, step: int, extras: dict[str, Any], ray: RayCompute
) -> Generator[dg.MaterializeResult, None, list[Any]]:
    """The worker as one Ray job in one Pipes session: submitted through the dashboard,
    its status polled every `ray.poll_interval`, each materialization handed to Dagster
    as the job's log reports it (read about once a second, then whole once the job has
    ended); returns the worker's custom messages. A step abandoned before the job ended
    (an interrupted run) stops the job."""
    jobs = ray_jobs(ray)
    reader = RayJobLogReader(jobs)
    submission = job_submission(ray)
    submission_id = f"rollout-shards-step{step}-{uuid.uuid4().hex[:10]}"
    with dg.open_pipes_session(
        context=context,
        context_injector=dg.PipesEnvContextInjector(),
        message_reader=reader,
        extras=extras,
    ) as session:
        reported = Reported(session, {"Ray Job ID": dg.MetadataValue.text(submission_id)})
        runtime_env = submission.get("runtime_env") or {}
        runtime_env["env_vars"] = {
            **runtime_env.get("env_vars", {}),
            **session.get_bootstrap_env_vars(),
        }
        submission.update(
            submission_id=submission_id,
            runtime_env=runtime_env,
            metadata={
                "dagster/run_id": context.run.run_id,
                "dagster/partition": context.partition_key,
                "dagster/job": context.job_name,
            },
        )
        context.log.info(f"[pipes] Starting Ray job {submission_id}...")
        try:
            jobs.submit(submission)
        except RayJobsError as error:
            raise UsageError(f"step {step}: compute ray: {error}") from None
        context.log.info(f"[pipes] Ray job {submission_id} started.")
        session.report_launched(
            {"extras": {RAY_ADDRESS_KEY: jobs.url, RAY_JOB_ID_KEY: submission_id}}
        )
        state = None
        try:
            while state is None or not state.terminal:
                if state is not None:
                    time.sleep(ray.poll_interval)
                try:
                    state = jobs.state(submission_id)
                except RayJobsError as error:
                    raise UsageError(f"step {step}: compute ray: {error}") from None
                yield from reported.new()
        finally:
            if state is None or not state.terminal:
                _stop_interrupted(context, jobs, step, submission_id)
        if state.status != SUCCEEDED:
            # Ray's message goes on with the log's last lines: the first one says why.
            why = state.message.strip().splitlines()[0] if state.message.strip() else "-"
            raise dg.Failure(
                description=f"step {step}: Ray job {submission_id} ended {state.status} "
                f"({why.rstrip(':')}); its output is in the step's logs"
            )
    # The session is closed: the job's whole log has been read, unless the last read failed.
    yield from reported.new()
    if reader.unread is not None:
        raise dg.Failure(
            description=f"step {step}: Ray job {submission_id} succeeded but its log could "
            f"not be read to the end ({reader.unread}); what it reported after the last "
            "read is not recorded, so the step is failed"
        )
    return list(session.get_custom_messages())


def _warm_queue(jobs: RayJobs, roots: StepRoots, ray: RayCompute) -> WarmQueue:
    """The queue of the warm jobs of this cluster and job settings, under the output root."""
    pool = json.dumps([jobs.url, job_submission(ray), ray.warm_worker_s], sort_keys=True)
    key = hashlib.sha256(pool.encode()).hexdigest()[:16]
    queue = WarmQueue(roots.output_root / WARM_FOLDER / key)
    queue.create()
    return queue


def _start_warm_job(jobs: RayJobs, queue: WarmQueue, step: int, ray: RayCompute) -> str | None:
    """Start a warm job if a step waits and every warm job is busy (up to the limit);
    returns the new job's id."""
    with queue.started_jobs() as started:
        live = [job for job in started if not jobs.state(job).terminal]
        started[:] = live
        waiting = queue.waiting()
        free = len(live) - queue.busy(set(live))
        if not waiting or free >= waiting or len(live) >= ray.warm_workers:
            return None
        job = f"rollout-shards-warm-{uuid.uuid4().hex[:10]}"
        submission = job_submission(ray)
        submission["entrypoint"] = (
            f"{submission['entrypoint']} --serve {shlex.quote(str(queue.folder))} "
            f"--job {job} --idle {ray.warm_worker_s}"
        )
        submission.update(submission_id=job, metadata={"rollout-shards/warm": str(step)})
        jobs.submit(submission)
        started.append(job)
        return job


def warm_ray_session(
    context: dg.AssetExecutionContext,
    step: int,
    extras: dict[str, Any],
    roots: StepRoots,
    ray: RayCompute,
) -> Generator[dg.MaterializeResult, None, list[Any]]:
    """The step as a request to a warm Ray job (`ray.warm_worker_s`): queued under the
    output root, taken by a running warm job or one started for it, its Pipes messages
    read from a file beside the queue; returns the worker's custom messages. A step
    abandoned while queued is withdrawn, one abandoned while building stops its job."""
    jobs = ray_jobs(ray)
    try:
        queue = _warm_queue(jobs, roots, ray)
    except OSError as exc:
        raise UsageError(f"step {step}: compute ray: cannot make the warm queue: {exc}") from exc
    request = uuid.uuid4().hex
    with dg.open_pipes_session(
        context=context,
        context_injector=dg.PipesEnvContextInjector(),
        message_reader=dg.PipesFileMessageReader(str(queue.message_file(request))),
        extras=extras,
    ) as session:
        queue.enqueue(request, session.get_bootstrap_env_vars())
        context.log.info(f"[pipes] step {step} queued for a warm Ray job in {queue.folder}")
        worker: str | None = None
        reported: Reported | None = None
        checked = -1.0
        worker_ended = False
        try:
            while True:
                closed = session.message_handler.received_closed_message
                if worker is None and (worker := queue.taker(request)) is not None:
                    context.log.info(f"[pipes] Ray job {worker} took step {step}.")
                    reported = Reported(session, {"Ray Job ID": dg.MetadataValue.text(worker)})
                if reported is not None:
                    yield from reported.new()
                if closed:
                    break
                if time.monotonic() - checked >= WARM_CHECK_S:
                    checked = time.monotonic()
                    if worker is None:
                        started = _start_warm_job(jobs, queue, step, ray)
                        if started is not None:
                            context.log.info(f"[pipes] Ray job {started} started.")
                    elif (state := jobs.state(worker)).terminal:
                        if session.message_handler.received_closed_message:
                            continue
                        worker_ended = True
                        raise dg.Failure(
                            description=f"step {step}: warm Ray job {worker} ended "
                            f"{state.status} while building the step; its output is in "
                            "the job's logs"
                        )
                time.sleep(ray.poll_interval)
        except RayJobsError as error:
            raise UsageError(f"step {step}: compute ray: {error}") from None
        finally:
            if not session.message_handler.received_closed_message and not worker_ended:
                if not queue.withdraw(request) and worker is not None:
                    _stop_interrupted(context, jobs, step, worker)
            queue.forget(request)
    if reported is not None:
        yield from reported.new()
    return list(session.get_custom_messages())


def _stop_interrupted(
    context: dg.AssetExecutionContext, jobs: RayJobs, step: int, job_id: str
) -> None:
    """Stop the Ray job of a step whose run was interrupted; a failed stop is a warning."""
    context.log.info(f"[pipes] step {step} interrupted: stopping Ray job {job_id}")
    try:
        jobs.stop(job_id)
    except RayJobsError as error:
        context.log.warning(f"[pipes] {error}")

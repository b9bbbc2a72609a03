"""Where the work of a step runs: in the run's process, or behind Dagster Pipes.

The selected assets of a step (usually all three) run in one session: in process, or one
Pipes worker that runs every selected stage and reports each asset. `compute` picks one of
- `in_process` (default): the stages run in the Dagster step's own process;
- `subprocess`: `python .../pipeline/orchestration/pipes_worker.py` on this machine (this
  process's own copy of the worker, by its path), in a Pipes
  session of its own (`dg.open_pipes_session`) that hands each asset to Dagster as the worker
  reports it;
- `ray`: the same worker as one Ray job, submitted and watched through the head's Ray Jobs
  REST API (`ray_jobs`), in a Pipes session of its own that, as for `subprocess`, hands
  each asset to Dagster as the job's log reports it (no Ray in the Dagster process); with
  `ray.warm_worker_s`, a warm Ray job that builds the steps of a backfill one after another
  instead of a job per step (`ray_jobs.WarmQueue`, docs/scaling-out.md);
- `k8s`: the same worker in a pod, via `dagster_k8s.PipesK8sClient` (extra `k8s`).
All four run `pipeline.step.stages.run_stages`, so shards and metadata are the same wherever
they are built. The Dagster step holds one slot of the concurrency pool `STEP_POOL` while its
session runs: the pool's limit (or the run queue's `max_concurrent_runs`) is how many steps
of a backfill build at once, on this machine or as concurrent Ray jobs or pods; on one
machine the step also holds a lock file per slot (`step_pool`), as SQLite storage's claim
can let runs that start together through.
The worker reads and writes the roots by path: on Ray or Kubernetes they must be on a
filesystem mounted at the same path on the workers (`k8s.base_pod_spec` mounts it in a pod).
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Generator, Iterator
from enum import StrEnum
from typing import Any

import dagster as dg
from pydantic import Field

from pipeline.errors import UsageError
from pipeline.orchestration.partitions import step_of
from pipeline.orchestration.pipes_worker import WORKER_FILE, reported_failure, worker_extras
from pipeline.orchestration.ray_jobs import (
    SUCCEEDED,
    RayJobs,
    RayJobsError,
    WarmQueue,
    dashboard_url,
)
from pipeline.orchestration.ray_logs import RAY_ADDRESS_KEY, RAY_JOB_ID_KEY, RayJobLogReader
from pipeline.orchestration.reporting import dagster_metadata
from pipeline.settings import Settings
from pipeline.step.roots import StepRoots
from pipeline.step.stages import run_stages, selected_stages

COMPUTE_ENV = "ROLLOUT_SHARDS_COMPUTE"
K8S_IMAGE_ENV = "ROLLOUT_SHARDS_K8S_IMAGE"
K8S_NAMESPACE_ENV = "ROLLOUT_SHARDS_K8S_NAMESPACE"
WORKER_MODULE = "pipeline.orchestration.pipes_worker"
WORKER_COMMAND = ["python", "-m", WORKER_MODULE]
# Isolated (-I): the cluster's installed package, whatever the job's working_dir puts on
# $PYTHONPATH or in its working directory (a `pipeline/` folder of its own). -I also drops
# the PYTHONUNBUFFERED that Ray sets, and the Pipes messages must reach the job's log as
# they are written: -u.
RAY_ENTRYPOINT = f"python -I -u -m {WORKER_MODULE}"
# How often the subprocess session looks for results the worker reported, and how long an
# interrupted worker gets to stop after SIGINT before it is killed.
RESULT_POLL_SECONDS = 0.02
TERMINATION_SECONDS = 20.0
# The warm queues' folder under the output root, and how often a step waiting on a warm job
# checks that job's state (or starts one).
WARM_FOLDER = ".ray-workers"
WARM_CHECK_S = 1.0

# Dagster's own Pipes code calls a preview API and a deprecated one on every launch; the
# warnings are not about anything this project does.
warnings.filterwarnings(
    "ignore", message=r"Function `PipesMessageReader\.expected_writer_count`", category=Warning
)
warnings.filterwarnings(
    "ignore", message=r"AssetExecutionContext\.run_id is deprecated", category=DeprecationWarning
)


class Compute(StrEnum):
    in_process = "in_process"
    subprocess = "subprocess"
    ray = "ray"
    k8s = "k8s"


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


class K8sCompute(dg.Config):
    """The pod of `compute: k8s`: an image with rollout-shards, the roots mounted by path."""

    image: str | None = Field(None, description=f"Image with rollout-shards; ${K8S_IMAGE_ENV}.")
    namespace: str | None = Field(None, description=f"Namespace; ${K8S_NAMESPACE_ENV}.")
    command: list[str] = Field(WORKER_COMMAND, description="Command of the pod's container.")
    env: dict[str, str] = Field({}, description="Environment of the pod's container.")
    base_pod_spec: dict[str, Any] | None = Field(
        None, description="Pod spec to start from: volumes mounting the roots, resources, ..."
    )
    base_pod_meta: dict[str, Any] | None = Field(None, description="Pod metadata: labels, ...")
    load_incluster_config: bool | None = Field(
        None, description="Load the in-cluster config (unset: when in a cluster)."
    )
    kubeconfig_file: str | None = Field(None, description="kubeconfig outside a cluster.")
    kube_context: str | None = Field(None, description="kubeconfig context.")
    poll_interval: float = Field(10.0, description="Seconds between pod status polls.")


def _client_class(module: str, name: str, extra: str) -> Any:
    """A Pipes client class from an optional extra, imported only when it is selected."""
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as error:
        raise UsageError(
            f"compute {extra} needs {module.replace('_', '-')}: "
            f"pip install 'rollout-shards[{extra}]' ({error})"
        ) from error


class StepCompute(dg.ConfigurableResource):
    """Where each asset's stage runs: in process, or a Pipes worker in a subprocess, on a
    Ray cluster or in a Kubernetes pod."""

    compute: Compute = Field(
        Compute.in_process, description=f"in_process, subprocess, ray or k8s; ${COMPUTE_ENV}."
    )
    python: str | None = Field(
        None, description="Interpreter of the subprocess worker (unset: this one)."
    )
    ray: RayCompute = Field(RayCompute(), description="The Ray job of compute: ray.")
    k8s: K8sCompute = Field(K8sCompute(), description="The pod of compute: k8s.")

    @classmethod
    def from_env(cls) -> StepCompute:
        value = os.environ.get(COMPUTE_ENV) or Compute.in_process.value
        if value not in Compute.__members__:
            raise UsageError(f"{COMPUTE_ENV}={value}: one of {', '.join(Compute.__members__)}")
        return cls(
            compute=Compute(value),
            k8s=K8sCompute(
                image=os.environ.get(K8S_IMAGE_ENV) or None,
                namespace=os.environ.get(K8S_NAMESPACE_ENV) or None,
            ),
        )

    def client(self) -> dg.PipesClient:
        """The Pipes client of `k8s` (`subprocess` and `ray` run their own sessions)."""
        if self.compute == Compute.k8s:
            k8s_client = _client_class("dagster_k8s", "PipesK8sClient", "k8s")
            return k8s_client(
                load_incluster_config=self.k8s.load_incluster_config,
                kubeconfig_file=self.k8s.kubeconfig_file,
                kube_context=self.k8s.kube_context,
                poll_interval=self.k8s.poll_interval,
            )
        raise UsageError(f"compute {self.compute.value} runs without a Pipes client")

    def run_arguments(self) -> dict[str, Any]:
        """The arguments of the client's `run` (the subprocess command, the Ray job's
        submission) besides context and extras; fresh each time, as the Ray session adds the
        Pipes variables to the runtime_env it is given."""
        if self.compute == Compute.subprocess:
            return {"command": [self.python or sys.executable, WORKER_FILE]}
        if self.compute == Compute.ray:
            params: dict[str, Any] = {"entrypoint": self.ray.entrypoint}
            if self.ray.runtime_env is not None:
                params["runtime_env"] = copy.deepcopy(self.ray.runtime_env)
            if self.ray.num_cpus is not None:
                params["entrypoint_num_cpus"] = self.ray.num_cpus
            if self.ray.memory is not None:
                params["entrypoint_memory"] = self.ray.memory
            return {"submit_job_params": params}
        if self.compute == Compute.k8s:
            if not self.k8s.image:
                raise UsageError(
                    f"compute k8s needs an image with rollout-shards: k8s.image or ${K8S_IMAGE_ENV}"
                )
            return {
                "image": self.k8s.image,
                "command": list(self.k8s.command),
                "namespace": self.k8s.namespace,
                "env": dict(self.k8s.env),
                "base_pod_spec": copy.deepcopy(self.k8s.base_pod_spec),
                "base_pod_meta": copy.deepcopy(self.k8s.base_pod_meta),
            }
        raise UsageError(f"compute {self.compute.value} runs in process, without a Pipes client")

    def materialize(
        self, context: dg.AssetExecutionContext, roots: StepRoots, settings: Settings | None = None
    ) -> Iterator[dg.MaterializeResult]:
        """Run the stages of the context's selected assets on its partition, in one session
        here or behind Pipes, yielding each asset's materialization; a StepError or
        UsageError of a stage is raised here either way, after the assets done before it."""
        stages = selected_stages(key.to_user_string() for key in context.selected_asset_keys)
        step = step_of(context.partition_key)
        if self.compute == Compute.in_process:
            for stage, report in run_stages(stages, roots, step, settings):
                context.log.info(report.log)
                yield dg.MaterializeResult(
                    asset_key=stage, metadata=dagster_metadata(report.metadata)
                )
            return
        names = ", ".join(stages)
        context.log.info(f"step {step}: {names} through Dagster Pipes ({self.compute.value})")
        extras = worker_extras(stages, roots, step, settings)
        if self.compute == Compute.subprocess:
            messages = yield from self._subprocess_session(context, step, extras)
        elif self.compute == Compute.ray and self.ray.warm_worker_s > 0:
            messages = yield from self._warm_ray_session(context, step, extras, roots)
        elif self.compute == Compute.ray:
            messages = yield from self._ray_session(context, step, extras)
        else:
            invocation = self.client().run(  # type: ignore[call-arg]
                context=context, extras=extras, **self.run_arguments()
            )
            # Only what the worker reported: an asset after a failed stage is not materialized.
            yield from _materializations(invocation.get_results(implicit_materializations=False))
            messages = list(invocation.get_custom_messages())
        failure = reported_failure(messages)
        if failure is not None:
            raise failure

    def _subprocess_session(
        self, context: dg.AssetExecutionContext, step: int, extras: dict[str, Any]
    ) -> Generator[dg.MaterializeResult, None, list[Any]]:
        """The worker as a child process in one Pipes session, each materialization handed to
        Dagster as soon as the worker reports it (so the UI shows `rollout_samples` while the
        step is still being written, and Dagster stores the first assets meanwhile instead of
        after the worker exits); returns the worker's custom messages. An interrupted run (or
        a step abandoned for any reason) stops the worker with SIGINT, then SIGKILL."""
        command = self.run_arguments()["command"]
        with dg.open_pipes_session(
            context=context,
            context_injector=dg.PipesTempFileContextInjector(),
            message_reader=dg.PipesTempFileMessageReader(),
            extras=extras,
        ) as session:
            reported = _Reported(session)
            env = {**os.environ, **session.get_bootstrap_env_vars()}
            try:
                process = subprocess.Popen(command, env=env)
            except OSError as exc:
                raise UsageError(f"compute subprocess: cannot start {command[0]}: {exc}") from exc
            try:
                while process.poll() is None:
                    yield from reported.new()
                    try:
                        process.wait(RESULT_POLL_SECONDS)
                    except subprocess.TimeoutExpired:
                        pass
            finally:
                if process.poll() is None:
                    context.log.info(f"[pipes] step {step} interrupted: stopping its worker")
                    _stop(process)
            if process.returncode != 0:
                raise dg.Failure(
                    description=f"step {step}: the Pipes worker (pid {process.pid}) exited "
                    f"with code {process.returncode}; its output is in the step's logs"
                )
        # The session is closed: every message the worker wrote has been read.
        yield from reported.new()
        return list(session.get_custom_messages())

    def _ray_session(
        self, context: dg.AssetExecutionContext, step: int, extras: dict[str, Any]
    ) -> Generator[dg.MaterializeResult, None, list[Any]]:
        """The worker as one Ray job in one Pipes session: submitted through the dashboard,
        its status polled every `ray.poll_interval`, each materialization handed to Dagster
        as the job's log reports it (read about once a second, then whole once the job has
        ended); returns the worker's custom messages. A step abandoned before the job ended
        (an interrupted run) stops the job."""
        jobs = self._ray_jobs()
        reader = RayJobLogReader(jobs)
        submission = self.run_arguments()["submit_job_params"]
        submission_id = f"rollout-shards-step{step}-{uuid.uuid4().hex[:10]}"
        with dg.open_pipes_session(
            context=context,
            context_injector=dg.PipesEnvContextInjector(),
            message_reader=reader,
            extras=extras,
        ) as session:
            reported = _Reported(session, {"Ray Job ID": dg.MetadataValue.text(submission_id)})
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
                        time.sleep(self.ray.poll_interval)
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

    def _ray_jobs(self) -> RayJobs:
        return RayJobs(
            dashboard_url(self.ray.address),
            headers=dict(self.ray.headers),
            ca_bundle=self.ray.ca_bundle,
        )

    def _warm_queue(self, jobs: RayJobs, roots: StepRoots) -> WarmQueue:
        """The queue of the warm jobs of this cluster and job settings, under the output root."""
        pool = json.dumps(
            [jobs.url, self.run_arguments()["submit_job_params"], self.ray.warm_worker_s],
            sort_keys=True,
        )
        key = hashlib.sha256(pool.encode()).hexdigest()[:16]
        queue = WarmQueue(roots.output_root / WARM_FOLDER / key)
        queue.create()
        return queue

    def _start_warm_job(self, jobs: RayJobs, queue: WarmQueue, step: int) -> str | None:
        """Start a warm job if a step waits and every warm job is busy (up to the limit);
        returns the new job's id."""
        with queue.started_jobs() as started:
            live = [job for job in started if not jobs.state(job).terminal]
            started[:] = live
            waiting = queue.waiting()
            free = len(live) - queue.busy(set(live))
            if not waiting or free >= waiting or len(live) >= self.ray.warm_workers:
                return None
            job = f"rollout-shards-warm-{uuid.uuid4().hex[:10]}"
            submission = self.run_arguments()["submit_job_params"]
            submission["entrypoint"] = (
                f"{submission['entrypoint']} --serve {shlex.quote(str(queue.folder))} "
                f"--job {job} --idle {self.ray.warm_worker_s}"
            )
            submission.update(submission_id=job, metadata={"rollout-shards/warm": str(step)})
            jobs.submit(submission)
            started.append(job)
            return job

    def _warm_ray_session(
        self,
        context: dg.AssetExecutionContext,
        step: int,
        extras: dict[str, Any],
        roots: StepRoots,
    ) -> Generator[dg.MaterializeResult, None, list[Any]]:
        """The step as a request to a warm Ray job (`ray.warm_worker_s`): queued under the
        output root, taken by a running warm job or one started for it, its Pipes messages
        read from a file beside the queue; returns the worker's custom messages. A step
        abandoned while queued is withdrawn, one abandoned while building stops its job."""
        jobs = self._ray_jobs()
        try:
            queue = self._warm_queue(jobs, roots)
        except OSError as exc:
            raise UsageError(
                f"step {step}: compute ray: cannot make the warm queue: {exc}"
            ) from exc
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
            reported: _Reported | None = None
            checked = -1.0
            worker_ended = False
            try:
                while True:
                    closed = session.message_handler.received_closed_message
                    if worker is None and (worker := queue.taker(request)) is not None:
                        context.log.info(f"[pipes] Ray job {worker} took step {step}.")
                        job_id = {"Ray Job ID": dg.MetadataValue.text(worker)}
                        reported = _Reported(session, job_id)
                    if reported is not None:
                        yield from reported.new()
                    if closed:
                        break
                    if time.monotonic() - checked >= WARM_CHECK_S:
                        checked = time.monotonic()
                        if worker is None:
                            started = self._start_warm_job(jobs, queue, step)
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
                    time.sleep(self.ray.poll_interval)
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


class _Reported:
    """What a Pipes session has received from its worker, each materialization handed to
    Dagster once, with `metadata` added to each."""

    def __init__(
        self, session: dg.PipesSession, metadata: dict[str, dg.MetadataValue] | None = None
    ) -> None:
        self._session = session
        self._metadata = metadata
        self._handed = 0

    def new(self) -> Iterator[dg.MaterializeResult]:
        """The materializations received since the last call."""
        results = self._session.get_results(
            implicit_materializations=False, metadata=self._metadata
        )
        fresh, self._handed = results[self._handed :], len(results)
        yield from _materializations(fresh)


def _stop_interrupted(
    context: dg.AssetExecutionContext, jobs: RayJobs, step: int, job_id: str
) -> None:
    """Stop the Ray job of a step whose run was interrupted; a failed stop is a warning."""
    context.log.info(f"[pipes] step {step} interrupted: stopping Ray job {job_id}")
    try:
        jobs.stop(job_id)
    except RayJobsError as error:
        context.log.warning(f"[pipes] {error}")


def _materializations(results: Any) -> Iterator[dg.MaterializeResult]:
    for result in results:
        if isinstance(result, dg.MaterializeResult):
            yield result


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGINT (the worker's Pipes session closes), then SIGKILL if it outlives the grace."""
    process.send_signal(signal.SIGINT)
    try:
        process.wait(TERMINATION_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()

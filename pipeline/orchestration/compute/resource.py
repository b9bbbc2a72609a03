"""The `step_compute` resource: where the stages of a step run.

The selected assets of a step (usually all three) run in one session: in process, or one
Pipes worker that runs every selected stage and reports each asset. All backends run
`pipeline.step.stages.run_stages`, so shards and metadata are the same wherever they are
built; each backend is a module of this package.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from enum import StrEnum
from typing import Any

import dagster as dg
from pydantic import Field

from pipeline.errors import UsageError
from pipeline.orchestration.compute.in_process import in_process_session
from pipeline.orchestration.compute.k8s_pod import (
    K8S_IMAGE_ENV,
    K8S_NAMESPACE_ENV,
    K8sCompute,
    k8s_client,
    k8s_session,
    pod_arguments,
)
from pipeline.orchestration.compute.ray_job import (
    RayCompute,
    job_submission,
    ray_session,
    warm_ray_session,
)
from pipeline.orchestration.compute.subprocess_worker import subprocess_session, worker_command
from pipeline.orchestration.partitions import step_of
from pipeline.orchestration.pipes_worker import reported_failure, worker_extras
from pipeline.settings import Settings
from pipeline.step.roots import StepRoots
from pipeline.step.stages import selected_stages

COMPUTE_ENV = "ROLLOUT_SHARDS_COMPUTE"


class Compute(StrEnum):
    in_process = "in_process"
    subprocess = "subprocess"
    ray = "ray"
    k8s = "k8s"


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
            return k8s_client(self.k8s)
        raise UsageError(f"compute {self.compute.value} runs without a Pipes client")

    def run_arguments(self) -> dict[str, Any]:
        """What the backend launches besides context and extras (the subprocess command,
        the Ray job's submission, the pod); fresh each time."""
        if self.compute == Compute.subprocess:
            return {"command": worker_command(self.python)}
        if self.compute == Compute.ray:
            return {"submit_job_params": job_submission(self.ray)}
        if self.compute == Compute.k8s:
            return pod_arguments(self.k8s)
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
            yield from in_process_session(context, stages, roots, step, settings)
            return
        names = ", ".join(stages)
        context.log.info(f"step {step}: {names} through Dagster Pipes ({self.compute.value})")
        extras = worker_extras(stages, roots, step, settings, self.compute == Compute.ray)
        if self.compute == Compute.subprocess:
            command = worker_command(self.python)
            messages = yield from subprocess_session(context, step, extras, command)
        elif self.compute == Compute.ray and self.ray.warm_worker_s > 0:
            messages = yield from warm_ray_session(context, step, extras, roots, self.ray)
        elif self.compute == Compute.ray:
            messages = yield from ray_session(context, step, extras, self.ray)
        else:
            messages = yield from k8s_session(context, extras, self.k8s)
        failure = reported_failure(messages)
        if failure is not None:
            raise failure

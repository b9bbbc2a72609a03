"""Where the work of a step runs: in the run's process, or behind Dagster Pipes.

The `step_compute` resource (`resource.StepCompute`) picks one backend, a module each:
- `in_process` (default): the stages run in the Dagster step's own process;
- `subprocess_worker`: the Pipes worker as a child process on this machine;
- `ray_job`: the same worker as one Ray job (or a warm one taking a backfill's steps);
- `k8s_pod`: the same worker in a pod, via `dagster_k8s.PipesK8sClient` (extra `k8s`).
All run `pipeline.step.stages.run_stages`, so shards and metadata are the same wherever
they are built. The Dagster step holds one slot of the concurrency pool `STEP_POOL` while
its session runs: the pool's limit (or the run queue's `max_concurrent_runs`) is how many
steps of a backfill build at once, on this machine or as concurrent Ray jobs or pods; on one
machine the step also holds a lock file per slot (`step_pool`), as SQLite storage's claim
can let runs that start together through. The worker reads and writes the roots by path:
on Ray or Kubernetes they must be on a filesystem mounted at the same path on the workers.
"""

from pipeline.orchestration.compute.k8s_pod import (
    K8S_IMAGE_ENV,
    K8S_NAMESPACE_ENV,
    WORKER_COMMAND,
    K8sCompute,
)
from pipeline.orchestration.compute.pipes_session import WORKER_MODULE
from pipeline.orchestration.compute.ray_job import RAY_ENTRYPOINT, RayCompute
from pipeline.orchestration.compute.resource import COMPUTE_ENV, Compute, StepCompute

__all__ = [
    "COMPUTE_ENV",
    "K8S_IMAGE_ENV",
    "K8S_NAMESPACE_ENV",
    "RAY_ENTRYPOINT",
    "WORKER_COMMAND",
    "WORKER_MODULE",
    "Compute",
    "K8sCompute",
    "RayCompute",
    "StepCompute",
]

"""`compute: k8s`: the Pipes worker in a pod, via `dagster_k8s.PipesK8sClient` (extra `k8s`).

The pod reads and writes the roots by path: `base_pod_spec` mounts them at the same path.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Generator
from typing import Any

import dagster as dg
from pydantic import Field

from pipeline.errors import UsageError
from pipeline.orchestration.compute.pipes_session import WORKER_MODULE, materializations

K8S_IMAGE_ENV = "ROLLOUT_SHARDS_K8S_IMAGE"
K8S_NAMESPACE_ENV = "ROLLOUT_SHARDS_K8S_NAMESPACE"
WORKER_COMMAND = ["python", "-m", WORKER_MODULE]


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


def k8s_client(k8s: K8sCompute) -> dg.PipesClient:
    """`dagster_k8s.PipesK8sClient` with the pod settings, imported only when selected."""
    try:
        client_class = importlib.import_module("dagster_k8s").PipesK8sClient
    except ImportError as error:
        raise UsageError(
            f"compute k8s needs dagster-k8s: pip install 'rollout-shards[k8s]' ({error})"
        ) from error
    client: dg.PipesClient = client_class(
        load_incluster_config=k8s.load_incluster_config,
        kubeconfig_file=k8s.kubeconfig_file,
        kube_context=k8s.kube_context,
        poll_interval=k8s.poll_interval,
    )
    return client


def pod_arguments(k8s: K8sCompute) -> dict[str, Any]:
    """The arguments of the client's `run` besides context and extras, fresh each time."""
    if not k8s.image:
        raise UsageError(
            f"compute k8s needs an image with rollout-shards: k8s.image or ${K8S_IMAGE_ENV}"
        )
    return {
        "image": k8s.image,
        "command": list(k8s.command),
        "namespace": k8s.namespace,
        "env": dict(k8s.env),
        "base_pod_spec": copy.deepcopy(k8s.base_pod_spec),
        "base_pod_meta": copy.deepcopy(k8s.base_pod_meta),
    }


def k8s_session(
    context: dg.AssetExecutionContext, extras: dict[str, Any], k8s: K8sCompute
) -> Generator[dg.MaterializeResult, None, list[Any]]:
    """The worker in one pod; the materializations it reported, once the pod has ended.
    Returns the worker's custom messages."""
    invocation = k8s_client(k8s).run(  # type: ignore[call-arg]
        context=context, extras=extras, **pod_arguments(k8s)
    )
    # Only what the worker reported: an asset after a failed stage is not materialized.
    yield from materializations(invocation.get_results(implicit_materializations=False))
    return list(invocation.get_custom_messages())

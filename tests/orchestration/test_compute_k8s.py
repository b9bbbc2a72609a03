"""The Kubernetes path end to end: the real `dagster_k8s.PipesK8sClient` against a stand-in
API server (tests/orchestration/kube_stand_in.py) that runs each pod's command on this machine.

What a cluster would add (pulling the image, scheduling, mounting the volume) is not here;
everything the project and Dagster do is: the client configured from run config, the pod
body it sends, the worker reading its Pipes context from the pod's environment, its
messages and metadata read back from the pod's log, failures, and the pods deleted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster_k8s import PipesK8sClient
from dagster_pipes import decode_param
from kube_stand_in import KubeStandIn, Pod, kube_stand_in

from pipeline.orchestration.compute import Compute, K8sCompute, StepCompute
from tests.support.dagster_roots import (
    PIPES_WARNINGS,
    Roots,
    break_step_1,
    materialize,
    metadata_of,
)
from tests.support.samples import only_refused

pytestmark = [
    *PIPES_WARNINGS,
    # dagster-k8s's own call, nothing this project makes.
    pytest.mark.filterwarnings("ignore:AssetExecutionContext.op is deprecated"),
]
STAGES = ("rollout_samples", "train_batch", "training_shards")
IMAGE = "registry.example/rollout-shards:0.1.0"
# The README's pod: the roots on a volume mounted at the same path as on the Dagster side.
POD_SPEC: dict[str, Any] = {
    "volumes": [{"name": "rollouts", "persistentVolumeClaim": {"claimName": "rollouts"}}],
    "containers": [
        {
            "name": "worker",
            "volumeMounts": [{"name": "rollouts", "mountPath": "/mnt/rollouts"}],
            "resources": {"requests": {"cpu": "1", "memory": "2Gi"}},
        }
    ],
}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[KubeStandIn]:
    with kube_stand_in(tmp_path) as cluster:
        yield cluster


def _compute(cluster: KubeStandIn, **pod: Any) -> StepCompute:
    return StepCompute(
        compute=Compute.k8s,
        k8s=K8sCompute(
            image=IMAGE,
            namespace="rl-data",
            env={"POLARS_MAX_THREADS": "1"},
            base_pod_spec=POD_SPEC,
            base_pod_meta={"labels": {"team": "rl"}},
            kubeconfig_file=str(cluster.kubeconfig),
            poll_interval=0.05,
            **pod,
        ),
    )


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container["env"]}


def test_the_client_is_dagster_k8s_own(cluster: KubeStandIn) -> None:
    client = _compute(cluster).client()

    assert isinstance(client, PipesK8sClient)
    assert client.kubeconfig_file == str(cluster.kubeconfig)
    assert client.poll_interval == 0.05


def test_the_whole_step_runs_in_one_pod(
    instance: dg.DagsterInstance, roots: Roots, cluster: KubeStandIn
) -> None:
    in_process = materialize(instance, "00000003")
    elsewhere = {"resources": {"rollout_storage": {"config": {"output_root": "k8s"}}}}

    result = materialize(instance, "00000003", elsewhere, compute=_compute(cluster))

    assert result.success
    assert all(check.passed for check in result.get_asset_check_evaluations())
    for name in ("rank=0.parquet", "rank=1.parquet"):
        here = (roots.output / "step=3" / name).read_bytes()
        assert (roots.output / "k8s" / "step=3" / name).read_bytes() == here
    shards = metadata_of(result, "training_shards")
    assert {"name": "written", "rows": 16} in [r.data for r in shards["rows"].value.records]
    assert {"name": "is_compact", "value": True} in [r.data for r in shards["layout"].value.records]
    assert shards["path"].value == str(roots.output / "k8s" / "step=3")
    for asset in STAGES:
        here, there = metadata_of(in_process, asset), metadata_of(result, asset)
        assert here.keys() == there.keys()
        # where the step is (its folder, its report's path in the metadata) differs
        where = ("path", "staged", "report", "report_figures")
        assert {k: v for k, v in here.items() if k not in where} == {
            k: v for k, v in there.items() if k not in where
        }

    (pod,) = cluster.pods.values()
    assert pod.deleted and pod.process.returncode == 0
    assert pod.namespace == "rl-data"
    assert pod.body["metadata"]["labels"]["team"] == "rl"
    spec = pod.body["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["volumes"] == POD_SPEC["volumes"]
    (container,) = spec["containers"]
    assert container["name"] == "worker"
    assert container["image"] == IMAGE
    assert container["command"] == ["python", "-m", "pipeline.orchestration.pipes_worker"]
    assert container["volumeMounts"] == [{"name": "rollouts", "mountPath": "/mnt/rollouts"}]
    env = _env(container)
    assert env["POLARS_MAX_THREADS"] == "1"
    assert {"DAGSTER_PIPES_CONTEXT", "DAGSTER_PIPES_MESSAGES"} <= env.keys()
    assert _stages(pod) == list(STAGES)


def _stages(pod: Pod) -> list[str]:
    """The stages the pod ran, from the Pipes context Dagster put in its environment."""
    context = decode_param(_env(pod.container)["DAGSTER_PIPES_CONTEXT"])
    return context["data"]["extras"]["stages"]


def test_an_invalid_step_fails_in_its_pod_and_writes_nothing(
    instance: dg.DagsterInstance, roots: Roots, cluster: KubeStandIn
) -> None:
    break_step_1(roots)
    in_process = materialize(instance, "00000001")

    result = materialize(instance, "00000001", compute=_compute(cluster))

    assert not result.success
    (failed,) = [e for e in result.all_events if e.is_step_failure]
    assert failed.step_key == "rollout_samples"
    expected = next(e for e in in_process.all_events if e.is_step_failure)
    failure = failed.step_failure_data.user_failure_data
    assert failure.description == expected.step_failure_data.user_failure_data.description
    assert "rule response_within_tokens" in failure.description
    assert only_refused(roots.output, 1)
    (pod,) = cluster.pods.values()
    assert pod.deleted


def test_a_pod_that_fails_fails_the_run(
    instance: dg.DagsterInstance, roots: Roots, cluster: KubeStandIn
) -> None:
    # An image without rollout-shards: the container's command cannot find the worker.
    compute = _compute(cluster, command=["python", "-c", "raise SystemExit('no pipeline here')"])

    result = materialize(instance, "00000001", compute=compute)

    assert not result.success
    (failed,) = [e for e in result.all_events if e.is_step_failure]
    assert failed.step_key == "rollout_samples"
    message = failed.step_failure_data.error.cause.message  # the DagsterK8sError
    assert "failed with message" in message and "no pipeline here" in message
    assert not roots.output.exists()
    (pod,) = cluster.pods.values()
    assert pod.deleted and pod.process.returncode == 1

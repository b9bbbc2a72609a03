"""Several partitions at once: three runs, each in its own process, on one Dagster
instance, one input root and one output root; two build their step in the run's process,
one in a Pipes worker of its own (`compute: subprocess`).

Each run is what the daemon starts for one partition of a backfill: `dagster job execute`
of the project's definitions in a process of its own, whose executor (in process) runs the
step that builds the three assets, then the five checks.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
from kube_stand_in import kube_stand_in

from pipeline.orchestration.partitions import rollout_steps, step_of
from pipeline.orchestration.resources import RolloutStorage
from pipeline.orchestration.step_pool import STEP_POOL
from pipeline.step.freshness import current_manifest
from tests.support.dagster_backfill import backfill
from tests.support.dagster_roots import EMBEDDED_KEYS, Roots, most_at_once

PIPES_OPENED = "[pipes] external process successfully opened dagster pipes."
# Three partitions: more than the step pool's two at once, and each kind of compute.
KEYS = EMBEDDED_KEYS[:3]


def _messages(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    return [record.user_message for record in instance.all_logs(run_id)]


def _check_results(instance: dg.DagsterInstance, run_id: str) -> dict[str, bool]:
    records = instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)
    evaluations = [record.get_dagster_event().event_specific_data for record in records]
    return {e.check_name: e.passed for e in evaluations}  # type: ignore[union-attr]


def test_three_partitions_build_concurrently(roots: Roots, tmp_path: Path) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    computes = {key: ("in_process", "subprocess")[i % 2] for i, key in enumerate(KEYS)}
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        instance.add_dynamic_partitions(rollout_steps.name, KEYS)

        backfill(home, tmp_path, KEYS, computes)

        runs = instance.get_runs()
        assert sorted(run.tags["dagster/partition"] for run in runs) == KEYS
        assert all(run.status == dg.DagsterRunStatus.SUCCESS for run in runs)
        # The runs ran side by side (on a loaded machine one may end before the last starts).
        stats = [instance.get_run_stats(run.run_id) for run in runs]
        assert most_at_once([(s.start_time, s.end_time) for s in stats]) >= 2
        for run in runs:
            # One step builds the three assets and runs the checks (its own check specs).
            assert instance.get_run_stats(run.run_id).steps_succeeded == 1
            checks = _check_results(instance, run.run_id)
            # the five checks on training_shards and the step's own step_keeps_every_rule
            assert len(checks) == 6 and all(checks.values()), (run.tags, checks)
            # a Pipes worker opened exactly where the partition's compute says
            worker = [m for m in _messages(instance, run.run_id) if PIPES_OPENED in m]
            assert len(worker) == (computes[run.tags["dagster/partition"]] == "subprocess")

    storage = RolloutStorage.from_env()
    settings = storage.settings()
    for key in KEYS:
        step = step_of(key)
        # Complete: the manifest matches these inputs and settings, every file its sha256.
        assert current_manifest(step, storage.step_sources(step), settings, roots.output)
    leftovers = [p.name for p in roots.output.iterdir() if p.name.startswith(".tmp-")]
    assert not leftovers


def test_the_step_pool_bounds_the_pods_of_a_backfill(roots: Roots, tmp_path: Path) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    with (
        kube_stand_in(tmp_path) as cluster,
        dg.instance_for_test(temp_dir=str(home)) as instance,
    ):
        instance.add_dynamic_partitions(rollout_steps.name, KEYS)
        instance.event_log_storage.set_concurrency_slots(STEP_POOL, 2)
        k8s = {"image": "rollout-shards:test", "kubeconfig_file": str(cluster.kubeconfig)}
        resources = {
            "step_compute": {"config": {"compute": "k8s", "k8s": {**k8s, "poll_interval": 0.1}}}
        }

        backfill(home, tmp_path, KEYS, "k8s", resources)

        runs = instance.get_runs()
        assert all(run.status == dg.DagsterRunStatus.SUCCESS for run in runs)
        pods = list(cluster.pods.values())
        # One pod per step, and never more than the pool's two at once.
        assert len(pods) == len(KEYS)
        spans = [(pod.started, pod.ended) for pod in pods if pod.ended is not None]
        assert len(spans) == len(KEYS)
        assert most_at_once(spans) <= 2
    for key in KEYS:
        assert (roots.output / f"step={step_of(key)}" / "manifest.json").is_file()

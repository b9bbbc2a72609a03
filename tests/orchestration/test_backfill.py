"""Several partitions at once: four runs, each in its own process, on one Dagster
instance, one input root and one output root.

Each run is what the daemon starts for one partition of a backfill: `dagster job execute`
of the project's definitions in a process of its own, whose executor (in process) runs the
step that builds the three assets, then the five checks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from kube_stand_in import kube_stand_in

from pipeline.orchestration.compute import COMPUTE_ENV
from pipeline.orchestration.partitions import rollout_steps, step_of
from pipeline.orchestration.resources import RolloutStorage
from pipeline.orchestration.step_pool import STEP_POOL
from pipeline.step.freshness import current_manifest
from tests.support.dagster_roots import EMBEDDED_KEYS, Roots, most_at_once

DAGSTER = Path(sys.executable).with_name("dagster")
# Four run processes share two cores (and whatever else runs).
TIMEOUT_S = 400


def _launch(key: str, config: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    command = [
        str(DAGSTER),
        *("job", "execute", "-m", "pipeline.definitions", "-j", "rollout_step_job"),
        *("--tags", json.dumps({"dagster/partition": key}), "-c", str(config)),
    ]
    with log.open("wb") as out:
        return subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _backfill(
    home: Path,
    tmp_path: Path,
    keys: list[str],
    compute: str,
    resources: dict[str, Any] | None = None,
) -> None:
    """One run per partition, all launched at once; waits for every one (bounded)."""
    config = tmp_path / "run_config.yaml"
    config.write_text(yaml.safe_dump({"resources": resources or {}}))
    env = {**os.environ, "DAGSTER_HOME": str(home), COMPUTE_ENV: compute}
    logs = {key: tmp_path / f"run-{key}.log" for key in keys}
    runs = {key: _launch(key, config, env, logs[key]) for key in keys}
    deadline = time.monotonic() + TIMEOUT_S
    try:
        for run in runs.values():
            run.wait(timeout=max(deadline - time.monotonic(), 0.1))
    finally:
        for run in runs.values():
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
    failed = {key: logs[key].read_text()[-3000:] for key, run in runs.items() if run.returncode}
    assert not failed, failed


def _check_results(instance: dg.DagsterInstance, run_id: str) -> dict[str, bool]:
    records = instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)
    evaluations = [record.get_dagster_event().event_specific_data for record in records]
    return {e.check_name: e.passed for e in evaluations}  # type: ignore[union-attr]


@pytest.mark.parametrize("compute", ["in_process", "subprocess"])
def test_four_partitions_build_concurrently(roots: Roots, tmp_path: Path, compute: str) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        instance.add_dynamic_partitions(rollout_steps.name, EMBEDDED_KEYS)

        _backfill(home, tmp_path, EMBEDDED_KEYS, compute)

        runs = instance.get_runs()
        assert sorted(run.tags["dagster/partition"] for run in runs) == EMBEDDED_KEYS
        assert all(run.status == dg.DagsterRunStatus.SUCCESS for run in runs)
        # All four were running at one moment: the last to start began before any ended.
        stats = [instance.get_run_stats(run.run_id) for run in runs]
        assert max(s.start_time for s in stats) < min(s.end_time for s in stats)
        for run in runs:
            # One step builds the three assets and runs the checks (its own check specs).
            assert instance.get_run_stats(run.run_id).steps_succeeded == 1
            checks = _check_results(instance, run.run_id)
            # the five checks on training_shards and the step's own step_keeps_every_rule
            assert len(checks) == 6 and all(checks.values()), (run.tags, checks)

    storage = RolloutStorage.from_env()
    settings = storage.settings()
    for key in EMBEDDED_KEYS:
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
        instance.add_dynamic_partitions(rollout_steps.name, EMBEDDED_KEYS)
        instance.event_log_storage.set_concurrency_slots(STEP_POOL, 2)
        k8s = {"image": "rollout-shards:test", "kubeconfig_file": str(cluster.kubeconfig)}
        resources = {
            "step_compute": {"config": {"compute": "k8s", "k8s": {**k8s, "poll_interval": 0.1}}}
        }

        _backfill(home, tmp_path, EMBEDDED_KEYS, "k8s", resources)

        runs = instance.get_runs()
        assert all(run.status == dg.DagsterRunStatus.SUCCESS for run in runs)
        pods = list(cluster.pods.values())
        # One pod per step, and never more than the pool's two at once.
        assert len(pods) == 4
        spans = [(pod.started, pod.ended) for pod in pods if pod.ended is not None]
        assert len(spans) == 4
        assert most_at_once(spans) <= 2
    for key in EMBEDDED_KEYS:
        assert (roots.output / f"step={step_of(key)}" / "manifest.json").is_file()

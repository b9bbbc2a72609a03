"""The stages behind Dagster Pipes: a worker process per asset, the same shards, metadata
and failures as in process; the Ray and Kubernetes clients built from configuration."""

from __future__ import annotations

import inspect
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster_k8s import PipesK8sClient

from pipeline.definitions import defs
from pipeline.errors import StepError, UsageError, Violation
from pipeline.orchestration.compute import (
    COMPUTE_ENV,
    K8S_IMAGE_ENV,
    Compute,
    K8sCompute,
    RayCompute,
    StepCompute,
)
from pipeline.orchestration.pipes_worker import WORKER_FILE, failure_message, reported_failure
from pipeline.orchestration.ray_jobs import dashboard_url
from pipeline.orchestration.reporting import FAILURE_TAG
from tests.support.dagster_roots import (
    PIPES_WARNINGS,
    STAND_IN,
    Roots,
    break_step_1,
    failed_at_the_batch,
    failed_in_one_line,
    interrupted_run,
    materialize,
    materialized,
    metadata_of,
    stand_in_run,
    step_failure,
    written_step,
)
from tests.support.samples import only_refused

pytestmark = PIPES_WARNINGS
SUBPROCESS = StepCompute(compute=Compute.subprocess)
ASSETS = ("rollout_samples", "train_batch", "training_shards")
# The launchpad run config of the README's "Scaling out" section.
RAY_RUN_CONFIG = """
resources:
  step_compute:
    config:
      compute: ray
      ray:
        address: http://ray-head:8265
        runtime_env: {env_vars: {POLARS_MAX_THREADS: "8"}}
        num_cpus: 8
"""
K8S_RUN_CONFIG = """
resources:
  step_compute:
    config:
      compute: k8s
      k8s:
        image: registry.example/rollout-shards:0.1.0
        namespace: rl-data
        base_pod_spec:
          volumes: [{name: rollouts, persistentVolumeClaim: {claimName: rollouts}}]
          containers:
            - name: worker
              volumeMounts: [{name: rollouts, mountPath: /mnt/rollouts}]
              resources: {requests: {cpu: "8", memory: 32Gi}}
"""


def _messages(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    return [record.user_message for record in instance.all_logs(run_id)]


def test_a_subprocess_worker_builds_the_step(instance: dg.DagsterInstance, roots: Roots) -> None:
    result = materialize(instance, "00000001", compute=SUBPROCESS)

    assert result.success
    folder = roots.output / "step=1"
    assert written_step(roots, 1)["counts"]["written"] == 16
    assert all(check.passed for check in result.get_asset_check_evaluations())
    messages = _messages(instance, result.run_id)
    # One worker session builds the whole step and reports each of the three assets.
    assert messages.count("[pipes] external process successfully opened dagster pipes.") == 1
    (line,) = [m for m in messages if m.startswith(f"step 1: {', '.join(ASSETS)} on ")]
    assert int(line.rsplit("pid ", 1)[1]) != os.getpid()
    assert materialized(result) == list(ASSETS)
    assert f"step 1: 16 rows written to {folder}" in messages
    assert not (roots.output / ".staging").exists()
    shards = metadata_of(result, "training_shards")
    assert {"name": "written", "rows": 16} in [r.data for r in shards["rows"].value.records]
    assert shards["path"].value == str(folder)


def _unrooted(value: object, root: Path) -> str:
    """A metadata text without the output root it names (as a path or a file: URL)."""
    return str(value).replace(root.absolute().as_uri(), "").replace(str(root.absolute()), "")


def test_pipes_metadata_and_shards_match_in_process(
    instance: dg.DagsterInstance, roots: Roots
) -> None:
    in_process = materialize(instance, "00000004")
    elsewhere = {"resources": {"rollout_storage": {"config": {"output_root": "pipes"}}}}
    piped = materialize(instance, "00000004", elsewhere, compute=SUBPROCESS)

    assert in_process.success and piped.success
    for asset in ASSETS:
        here, there = metadata_of(in_process, asset), metadata_of(piped, asset)
        assert here.keys() == there.keys()
        for key in here:
            if key in ("path", "staged"):
                relative = Path(there[key].value).relative_to(roots.output / "pipes")
                assert Path(here[key].value).relative_to(roots.output) == relative
            elif key in ("report", "report_figures"):  # the page's path, in each root
                assert _unrooted(here[key].value, roots.output) == _unrooted(
                    there[key].value, roots.output / "pipes"
                ), (asset, key)
            else:
                assert here[key] == there[key], (asset, key)
    for name in ("rank=0.parquet", "rank=1.parquet", "report.html"):
        in_process_bytes = (roots.output / "step=4" / name).read_bytes()
        assert (roots.output / "pipes" / "step=4" / name).read_bytes() == in_process_bytes


def test_an_invalid_step_fails_through_pipes_with_its_summary(
    instance: dg.DagsterInstance, roots: Roots
) -> None:
    break_step_1(roots)

    in_process = materialize(instance, "00000001")
    result = materialize(instance, "00000001", compute=SUBPROCESS)

    assert not result.success
    step_key, failure = step_failure(result)
    assert step_key == "rollout_samples"
    assert "rule response_within_tokens" in failure.description
    expected = step_failure(in_process)[1]
    assert failure.description == expected.description
    assert failure.metadata == expected.metadata
    rows = failure.metadata["first_offending_rows"].value
    assert f"| response_within_tokens | {roots.input / 'step=1.parquet'} | 2 | 0 |" in rows
    assert "response_within_tokens" in instance.get_run_by_id(result.run_id).tags[FAILURE_TAG]
    assert only_refused(roots.output, 1)


def test_settings_the_data_cannot_satisfy_fail_in_the_worker(
    instance: dg.DagsterInstance, roots: Roots
) -> None:
    run_config = {"ops": {"rollout_samples": {"config": {"global_batch_size": 64}}}}

    result = materialize(instance, "00000002", run_config, compute=SUBPROCESS)

    failed_at_the_batch(result, roots, 2)


def test_one_asset_runs_alone_in_its_worker_through_staging(
    instance: dg.DagsterInstance, roots: Roots
) -> None:
    for asset in ASSETS:
        selection = dg.AssetSelection.assets(asset)
        result = materialize(instance, "00000003", selection=selection, compute=SUBPROCESS)
        assert result.success
        assert materialized(result) == [asset]
    staged = roots.output / ".staging"
    assert (staged / "rollout_samples" / "step=3" / "samples.parquet").is_file()
    assert (staged / "train_batch" / "step=3" / "batch.parquet").is_file()
    assert json.loads((roots.output / "step=3" / "manifest.json").read_text())["step"] == 3


def _worker_script(tmp_path: Path, body: str) -> StepCompute:
    """Compute subprocess whose "interpreter" is a script: the session runs it as the worker."""
    script = tmp_path / "worker.sh"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return StepCompute(compute=Compute.subprocess, python=str(script))


def test_each_asset_reaches_dagster_while_the_worker_still_runs(
    instance: dg.DagsterInstance, roots: Roots, tmp_path: Path
) -> None:
    # The stand-in reports rollout_samples, then waits until Dagster has stored it.
    compute = _worker_script(tmp_path, f"exec {sys.executable} {STAND_IN} streaming")

    result, messages = stand_in_run(instance, compute)

    assert result.success
    assert "stored while the worker ran: ['rollout_samples']" in messages
    assert materialized(result) == list(ASSETS)


def test_a_worker_that_crashes_fails_the_step_in_one_line(
    instance: dg.DagsterInstance, roots: Roots, tmp_path: Path
) -> None:
    result = materialize(instance, "00000001", compute=_worker_script(tmp_path, "exit 3"))

    failed_in_one_line(
        result,
        r"step 1: the Pipes worker \(pid \d+\) exited with code 3; its output is in the "
        r"step's logs",
        roots.output,
    )


def test_a_full_disk_in_the_worker_is_the_command_lines_one_line(
    instance: dg.DagsterInstance, roots: Roots, tmp_path: Path
) -> None:
    """The worker's rank-file writes go to /dev/full (a real ENOSPC): the step fails with
    the line `rollout-shards build` prints for a full disk, naming the output root."""
    patch = tmp_path / "full_disk.py"
    patch.write_text(
        "import runpy, sys\n"
        "import polars as pl\n"
        "write = pl.DataFrame.write_parquet\n"
        "pl.DataFrame.write_parquet = lambda frame, _, **kw: write(frame, '/dev/full', **kw)\n"
        "sys.argv = sys.argv[1:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    compute = _worker_script(tmp_path, f'exec {sys.executable} {patch} "$@"')

    result = materialize(instance, "00000001", compute=compute)

    assert not result.success
    _, failure = step_failure(result)
    line = failure.description
    # Polars names the OS error, or for a file its buffer held whole, loses it
    assert line.startswith("rollout-shards: build: step 1: rule os_error: ")
    assert f"no space left on {roots.output}" in line or (
        f"the write failed (Invalid thrift: transport error) on {roots.output}" in line
    )
    assert "\n" not in line and "AttributeError" not in line
    assert not (roots.output / "step=1").exists()


def test_an_interrupted_run_stops_its_worker(roots: Roots, tmp_path: Path) -> None:
    pid_file = tmp_path / "worker.pid"
    _worker_script(tmp_path, f"exec {sys.executable} {STAND_IN} hang {pid_file}")
    run = (
        "import os, sys; sys.path[:0] = sys.argv[1].split(os.pathsep); import dagster as dg; "
        "from tests.support.dagster_roots import materialize; "
        "from pipeline.orchestration.compute import Compute, StepCompute\n"
        "with dg.instance_for_test() as instance:\n"
        "    materialize(instance, '00000001', compute=StepCompute(compute=Compute.subprocess, "
        "python=sys.argv[2]))"
    )
    stderr, worker = interrupted_run(run, [str(tmp_path / "worker.sh")], pid_file)

    assert "step 1 interrupted: stopping its worker" in stderr
    with pytest.raises(ProcessLookupError):  # stopped, and reaped by the session
        os.kill(worker, 0)


def test_failures_survive_the_trip_through_pipes() -> None:
    violation = Violation(
        rule="response_within_tokens",
        message="response longer than tokens",
        step=1,
        files=["a.parquet"],
        rows=[(2, 0), (5, 1)],
        n_rows=2,
    )
    messages = [{"other": 1}, json.loads(json.dumps(failure_message(StepError([violation]))))]

    error = reported_failure(messages)

    assert isinstance(error, StepError)
    assert error.violations == [violation]
    usage = reported_failure([failure_message(UsageError("no rollout tables for step 9"))])
    assert isinstance(usage, UsageError) and str(usage) == "no rollout tables for step 9"
    assert reported_failure([{"other": 1}]) is None


def test_the_worker_needs_dagster_pipes_only() -> None:
    code = (
        "import json, sys, pipeline.orchestration.pipes_worker; "
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)

    loaded = set(json.loads(out.stdout))
    assert "dagster_pipes" in loaded
    assert not loaded & {"dagster", "dagster_ray", "dagster_k8s", "ray", "kubernetes"}


def test_compute_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(COMPUTE_ENV, "subprocess")
    monkeypatch.setenv(K8S_IMAGE_ENV, "registry.example/rollout-shards:0.1.0")
    compute = StepCompute.from_env()
    assert compute.compute == Compute.subprocess
    assert compute.k8s.image == "registry.example/rollout-shards:0.1.0"
    assert compute.run_arguments() == {"command": [sys.executable, WORKER_FILE]}

    monkeypatch.delenv(COMPUTE_ENV)
    assert StepCompute.from_env().compute == Compute.in_process
    monkeypatch.setenv(COMPUTE_ENV, "spark")
    with pytest.raises(UsageError, match="ROLLOUT_SHARDS_COMPUTE=spark: one of in_process"):
        StepCompute.from_env()


def _configured(run_config: str) -> StepCompute:
    """The resource as a launch with this run config gets it (checked against the job)."""
    parsed = yaml.safe_load(run_config)
    job = defs.resolve_job_def("rollout_step_job")
    dg.validate_run_config(job, parsed)
    return StepCompute(**parsed["resources"]["step_compute"]["config"])


# The fields of a submission in Ray's Jobs REST API (POST /api/jobs/).
RAY_SUBMISSION_FIELDS = {
    "entrypoint",
    "submission_id",
    "runtime_env",
    "metadata",
    "entrypoint_num_cpus",
    "entrypoint_num_gpus",
    "entrypoint_memory",
    "entrypoint_resources",
}


def test_the_ray_job_from_run_config() -> None:
    compute = _configured(RAY_RUN_CONFIG)

    assert dashboard_url(compute.ray.address) == "http://ray-head:8265"
    arguments = compute.run_arguments()
    assert arguments == {
        "submit_job_params": {
            "entrypoint": "python -I -u -m pipeline.orchestration.pipes_worker",
            "runtime_env": {"env_vars": {"POLARS_MAX_THREADS": "8"}},
            "entrypoint_num_cpus": 8.0,
        }
    }
    assert set(arguments["submit_job_params"]) <= RAY_SUBMISSION_FIELDS
    # The session adds the Pipes variables to the runtime_env it gets: a copy, every launch.
    arguments["submit_job_params"]["runtime_env"]["env_vars"]["DAGSTER_PIPES_CONTEXT"] = "x"
    assert compute.ray.runtime_env == {"env_vars": {"POLARS_MAX_THREADS": "8"}}


def test_the_ray_address_is_the_dashboard_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(
        UsageError, match=re.escape("ray.address (http://head:8265) or $RAY_ADDRESS")
    ):
        dashboard_url(None)
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265/")
    assert dashboard_url(None) == "http://head:8265"
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "https://ray.example")
    assert dashboard_url(None) == "https://ray.example"
    assert dashboard_url("http://other:8265") == "http://other:8265"
    with pytest.raises(UsageError, match=re.escape("the Ray address 'ray://head:10001' is not")):
        dashboard_url("ray://head:10001")


def test_an_unreachable_ray_head_fails_the_step_in_one_line(
    instance: dg.DagsterInstance, roots: Roots
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    compute = StepCompute(compute=Compute.ray, ray=RayCompute(address=url))

    result = materialize(instance, "00000001", compute=compute)

    failed_in_one_line(
        result,
        rf"rollout-shards: usage error: step 1: compute ray: the Ray dashboard at {re.escape(url)} "
        r"did not answer POST /api/jobs/: .*[Cc]onnection refused.*",
        roots.output,
    )


def test_the_dagster_side_of_ray_imports_no_ray() -> None:
    code = (
        "import json, sys, pipeline.definitions, pipeline.orchestration.ray_jobs; "
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)

    assert not set(json.loads(out.stdout)) & {"ray", "dagster_ray"}


def test_the_k8s_client_from_run_config() -> None:
    compute = _configured(K8S_RUN_CONFIG)

    client = compute.client()
    assert isinstance(client, PipesK8sClient)
    assert client.load_incluster_config is None
    assert (client.kubeconfig_file, client.kube_context, client.poll_interval) == (None, None, 10.0)
    arguments = compute.run_arguments()
    assert set(arguments) | {"context", "extras"} <= inspect.signature(client.run).parameters.keys()
    assert arguments["image"] == "registry.example/rollout-shards:0.1.0"
    assert arguments["command"] == ["python", "-m", "pipeline.orchestration.pipes_worker"]
    assert arguments["namespace"] == "rl-data"
    spec = arguments["base_pod_spec"]
    assert spec["containers"][0]["volumeMounts"] == [
        {"name": "rollouts", "mountPath": "/mnt/rollouts"}
    ]


def test_k8s_needs_an_image() -> None:
    with pytest.raises(UsageError, match=re.escape("k8s.image or $ROLLOUT_SHARDS_K8S_IMAGE")):
        StepCompute(compute=Compute.k8s).run_arguments()


def test_a_missing_extra_fails_the_run_with_the_install_line(
    instance: dg.DagsterInstance, roots: Roots, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "dagster_k8s", None)
    compute = StepCompute(compute=Compute.k8s, k8s=K8sCompute(image="rollout-shards:0.1.0"))

    result = materialize(instance, "00000001", compute=compute)

    step_key, failure = step_failure(result)
    assert step_key == "rollout_samples"
    assert "compute k8s needs dagster-k8s: pip install 'rollout-shards[k8s]'" in failure.description
    assert not roots.output.exists()


def test_in_process_and_subprocess_have_no_pipes_client() -> None:
    with pytest.raises(UsageError, match="compute in_process runs without a Pipes client"):
        StepCompute().client()
    with pytest.raises(UsageError, match="compute subprocess runs without a Pipes client"):
        SUBPROCESS.client()
    with pytest.raises(UsageError, match="compute ray runs without a Pipes client"):
        StepCompute(compute=Compute.ray).client()
    assert RayCompute().entrypoint == "python -I -u -m pipeline.orchestration.pipes_worker"


def test_a_ray_log_that_cannot_be_read_at_the_end_is_reported_not_raised() -> None:
    from pipeline.orchestration.ray_jobs import RayJobsError
    from pipeline.orchestration.ray_logs import RAY_JOB_ID_KEY, RayJobLogReader

    class DashboardGone:
        def logs(self, submission_id: str) -> str:
            raise RayJobsError(
                f"the Ray dashboard at http://head:8265 did not answer {submission_id}"
            )

    reader = RayJobLogReader(DashboardGone(), interval=0.01)  # type: ignore[arg-type]
    reader.on_launched({"extras": {RAY_JOB_ID_KEY: "job-1"}})
    with reader.read_messages(handler=None):  # type: ignore[arg-type]
        time.sleep(0.05)  # live reads fail and are logged; the session goes on

    assert reader.unread == "the Ray dashboard at http://head:8265 did not answer job-1"

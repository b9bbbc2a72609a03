"""The Ray path end to end against a local Ray head bound to 127.0.0.1.

Part of `make test` (the `ray` extra is installed there): starting a head takes about a
minute and several hundred MB. A step's stages run as one Ray job submitted through the head's
Jobs REST API (`pipeline.orchestration.ray_jobs`); logs and metadata come back in the job's
log.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import requests
from dagster_support import (
    STAND_IN,
    Roots,
    configured_roots,
    failed_in_one_line,
    interrupted_run,
    materialize,
    materialized,
    metadata_of,
    most_at_once,
    stand_in_run,
)
from ray.job_submission import JobSubmissionClient
from test_backfill import _backfill

from pipeline.orchestration.compute import Compute, RayCompute, StepCompute
from pipeline.orchestration.partitions import rollout_steps
from pipeline.orchestration.step_pool import STEP_POOL

pytestmark = [
    pytest.mark.filterwarnings("ignore:Function `PipesMessageReader.expected_writer_count`"),
    pytest.mark.filterwarnings("ignore:AssetExecutionContext.run_id is deprecated"),
    # Ray's own deprecation in JobSubmissionClient, which only the tests use.
    pytest.mark.filterwarnings("ignore:ssl=None is deprecated"),
]
HEAD_START_S = 120
# The head's own shutdown takes half a minute; nothing of it is needed after the tests.
STOP_GRACE_S = 5


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_for_dashboard(url: str, head: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + HEAD_START_S
    while time.monotonic() < deadline:
        if head.poll() is not None:
            pytest.fail(f"ray head exited {head.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/api/version", timeout=2) as response:
                json.load(response)
            return
        except OSError:
            time.sleep(1)
    pytest.fail(f"ray dashboard did not answer in {HEAD_START_S}s: {log.read_text()[-2000:]}")


def _wait_for_job_agent(url: str, log: Path) -> None:
    """The dashboard answers before its job agent does ("No available agent to submit
    job", or a dropped connection while the agent starts): submit a no-op job until one is
    taken, and let it finish."""
    client = JobSubmissionClient(url)
    deadline = time.monotonic() + HEAD_START_S
    while time.monotonic() < deadline:
        try:
            job = client.submit_job(entrypoint="true", submission_id=f"warm-up-{time.time_ns()}")
        except (RuntimeError, requests.RequestException):
            time.sleep(1)
            continue
        while not client.get_job_status(job).is_terminal():
            time.sleep(0.2)
        return
    pytest.fail(f"ray job agent did not start in {HEAD_START_S}s: {log.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def ray_dashboard() -> Iterator[str]:
    """A one-node Ray cluster on 127.0.0.1, shared by this module's tests (a head takes
    tens of seconds to start); stopped through its own process group."""
    # Ray puts sockets under its temp dir, and their paths must stay short.
    temp = Path(tempfile.mkdtemp(prefix="rs-ray-", dir="/tmp"))
    gcs_port, dashboard_port = _free_port(), _free_port()
    # Ray turns 127.0.0.1 into the machine's address unless it is told the cluster is one
    # machine; this keeps every Ray process on the loopback interface.
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    command = [
        str(Path(sys.executable).with_name("ray")),
        *("start", "--head", "--block", "--disable-usage-stats", "--num-cpus=1"),
        "--node-ip-address=127.0.0.1",
        f"--port={gcs_port}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard_port}",
        "--include-dashboard=true",
        f"--temp-dir={temp}",
        # Ray's agents listen on fixed default ports: free ones let two heads (two test
        # sessions on one machine) start side by side.
        *(
            f"--{name}={_free_port()}"
            for name in (
                "dashboard-agent-listen-port",
                "dashboard-agent-grpc-port",
                "metrics-export-port",
                "runtime-env-agent-port",
                "ray-client-server-port",
            )
        ),
    ]
    log = temp / "head.log"
    with log.open("wb") as out:
        head = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{dashboard_port}"
    try:
        _wait_for_dashboard(url, head, log)
        _wait_for_job_agent(url, log)
        yield url
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture
def roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Roots:
    return configured_roots(tmp_path, monkeypatch)


def test_ray_jobs_build_the_step(ray_dashboard: str, roots: Roots) -> None:
    # The head runs on this machine, so the job can use this interpreter and these roots.
    compute = StepCompute(
        compute=Compute.ray,
        ray=RayCompute(
            address=ray_dashboard,
            entrypoint=f"{sys.executable} -m pipeline.orchestration.pipes_worker",
            poll_interval=0.5,
        ),
    )
    with dg.instance_for_test() as instance:
        result = materialize(instance, "00000004", compute=compute)

        assert result.success
        messages = [record.user_message for record in instance.all_logs(result.run_id)]
    folder = roots.output / "step=4"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["counts"]["written"] == 8
    assert sorted(p.name for p in folder.glob("rank=*.parquet")) == [
        "rank=0.parquet",
        "rank=1.parquet",
    ]
    assert all(check.passed for check in result.get_asset_check_evaluations())
    # One Ray job built the step and reported all three assets.
    assert materialized(result) == ["rollout_samples", "train_batch", "training_shards"]
    job_ids = {metadata_of(result, asset)["Ray Job ID"].value for asset in materialized(result)}
    (job_id,) = job_ids
    assert job_id.startswith("rollout-shards-step4-")
    rows = metadata_of(result, "training_shards")["rows"].value.records
    assert {"name": "written", "rows": 8} in [record.data for record in rows]
    assert f"step 4: 8 rows written to {folder}" in messages
    assert [m for m in messages if m.startswith("[pipes] Ray job ")] == [
        f"[pipes] Ray job {job_id} started."
    ]
    assert not (roots.output / ".staging").exists()


def test_a_backfill_runs_its_steps_as_concurrent_ray_jobs(
    ray_dashboard: str, roots: Roots, tmp_path: Path
) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    since_ms = time.time_ns() // 1_000_000
    keys = ["00000001", "00000002", "00000003"]
    ray = {
        "address": ray_dashboard,
        "entrypoint": f"{sys.executable} -m pipeline.orchestration.pipes_worker",
    }
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        instance.add_dynamic_partitions(rollout_steps.name, keys)
        instance.event_log_storage.set_concurrency_slots(STEP_POOL, len(keys))

        _backfill(
            home,
            tmp_path,
            keys,
            "ray",
            {"step_compute": {"config": {"compute": "ray", "ray": ray}}},
        )

        assert all(run.status == dg.DagsterRunStatus.SUCCESS for run in instance.get_runs())
    jobs = [
        job
        for job in JobSubmissionClient(ray_dashboard).list_jobs()
        if (job.submission_id or "").startswith("rollout-shards-step")
        and (job.start_time or 0) >= since_ms
    ]
    # One Ray job per step, and the steps' jobs ran side by side.
    assert sorted(job.status.value for job in jobs) == ["SUCCEEDED"] * len(keys)
    assert most_at_once([(job.start_time, job.end_time) for job in jobs]) >= 2
    for key in keys:
        assert (roots.output / f"step={int(key)}" / "manifest.json").is_file()


def _ray_compute(ray_dashboard: str, entrypoint: str) -> StepCompute:
    # The stand-ins find the test's Dagster instance through $DAGSTER_HOME.
    env = {"DAGSTER_HOME": os.environ["DAGSTER_HOME"]}
    return StepCompute(
        compute=Compute.ray,
        ray=RayCompute(address=ray_dashboard, entrypoint=entrypoint, runtime_env={"env_vars": env}),
    )


def test_each_asset_reaches_dagster_while_the_ray_job_still_runs(
    ray_dashboard: str, roots: Roots
) -> None:
    with dg.instance_for_test() as instance:
        compute = _ray_compute(ray_dashboard, f"{sys.executable} {STAND_IN} streaming")
        result, messages = stand_in_run(instance, compute)

    assert result.success
    # The stand-in waited for Dagster to store rollout_samples before reporting the rest.
    assert "stored while the worker ran: ['rollout_samples']" in messages
    assert materialized(result) == ["rollout_samples", "train_batch", "training_shards"]


def test_a_failing_ray_job_fails_the_step_in_one_line(ray_dashboard: str, roots: Roots) -> None:
    with dg.instance_for_test() as instance:
        entrypoint = f"{sys.executable} -c 'import sys; sys.exit(3)'"
        result = materialize(instance, "00000001", compute=_ray_compute(ray_dashboard, entrypoint))

    failed_in_one_line(
        result,
        r"step 1: Ray job rollout-shards-step1-\w+ ended FAILED \(Job entrypoint command failed "
        r"with exit code 3, last available logs.*\); its output is in the step's logs",
        roots.output,
    )


def test_an_interrupted_run_stops_its_ray_job(
    ray_dashboard: str, roots: Roots, tmp_path: Path
) -> None:
    pid_file = tmp_path / "worker.pid"
    run = (
        "import sys; sys.path.insert(0, sys.argv[1]); import dagster as dg; "
        "from dagster_support import materialize; "
        "from test_compute_ray import _ray_compute\n"
        "with dg.instance_for_test() as instance:\n"
        "    materialize(instance, '00000001', compute=_ray_compute(sys.argv[2], sys.argv[3]))"
    )
    entrypoint = f"{sys.executable} {STAND_IN} hang {pid_file}"

    stderr, worker = interrupted_run(run, [ray_dashboard, entrypoint], pid_file)

    (line,) = [line for line in stderr.splitlines() if "interrupted: stopping Ray job" in line]
    job_id = re.search(r"stopping Ray job (\S+)", line).group(1)  # type: ignore[union-attr]
    client = JobSubmissionClient(ray_dashboard)
    deadline = time.monotonic() + 60
    while not client.get_job_status(job_id).is_terminal() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert client.get_job_status(job_id).value == "STOPPED"
    deadline = time.monotonic() + 30
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(worker)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True

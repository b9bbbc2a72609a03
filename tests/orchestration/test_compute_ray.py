"""The Ray path end to end against a local Ray head bound to 127.0.0.1.

Part of `make test` (the `ray` extra is installed there): the head (`ray_head` in
conftest.py) starts once per test session, in tens of seconds and several hundred MB. A
step's stages run as one Ray job submitted through the head's Jobs REST API
(`pipeline.orchestration.ray_jobs`); logs and metadata come back in the job's log.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from ray.job_submission import JobSubmissionClient

from pipeline.orchestration.compute import RAY_ENTRYPOINT, Compute, RayCompute, StepCompute
from pipeline.orchestration.partitions import rollout_steps
from pipeline.orchestration.pipes_worker import WORKER_FILE
from pipeline.orchestration.ray_jobs import RayJobs, RayJobsError
from pipeline.orchestration.step_pool import STEP_POOL
from tests.support.dagster_backfill import backfill
from tests.support.dagster_roots import (
    PIPES_WARNINGS,
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
    step_failure,
)
from tests.support.ray_head import RayHead

pytestmark = [
    *PIPES_WARNINGS,
    # Ray's own deprecation in JobSubmissionClient, which only the tests use.
    pytest.mark.filterwarnings("ignore:ssl=None is deprecated"),
]


def _client(url: str) -> JobSubmissionClient:
    """Ray's own client, with the token the test's environment holds (if any)."""
    token = os.environ.get("RAY_AUTH_TOKEN")
    return JobSubmissionClient(url, headers={"Authorization": f"Bearer {token}"} if token else None)


@pytest.fixture
def roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Roots:
    return configured_roots(tmp_path, monkeypatch)


def _module_job(address: str) -> StepCompute:
    """Ray jobs on the head at `address` that run the Pipes worker as a module of this
    interpreter (the head runs on this machine, so the job can use it and these roots)."""
    return StepCompute(
        compute=Compute.ray,
        ray=RayCompute(
            address=address,
            entrypoint=f"{sys.executable} -m pipeline.orchestration.pipes_worker",
            poll_interval=0.5,
        ),
    )


def test_ray_jobs_build_the_step(ray_dashboard: str, roots: Roots) -> None:
    compute = _module_job(ray_dashboard)
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


# Two steps: enough for jobs side by side, and for one warm job taking more than one step.
BACKFILL = ["00000001", "00000002"]


@contextlib.contextmanager
def _ray_backfill(tmp_path: Path, **ray: Any) -> Iterator[dg.DagsterInstance]:
    """A backfill of BACKFILL's steps as Ray jobs (`ray`: the backend's settings) on a test
    instance with a slot per step; the instance, its runs done and every one a success."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        instance.add_dynamic_partitions(rollout_steps.name, BACKFILL)
        instance.event_log_storage.set_concurrency_slots(STEP_POOL, len(BACKFILL))
        compute = {"step_compute": {"config": {"compute": "ray", "ray": ray}}}
        backfill(home, tmp_path, BACKFILL, "ray", compute)
        assert all(run.status == dg.DagsterRunStatus.SUCCESS for run in instance.get_runs())
        yield instance


def test_a_backfill_runs_its_steps_as_concurrent_ray_jobs(
    ray_dashboard: str, roots: Roots, tmp_path: Path
) -> None:
    since_ms = time.time_ns() // 1_000_000
    entrypoint = f"{sys.executable} -m pipeline.orchestration.pipes_worker"
    with _ray_backfill(tmp_path, address=ray_dashboard, entrypoint=entrypoint):
        jobs = [
            job
            for job in _client(ray_dashboard).list_jobs()
            if (job.submission_id or "").startswith("rollout-shards-step")
            and (job.start_time or 0) >= since_ms
        ]
    # One Ray job per step, and the steps' jobs ran side by side.
    assert sorted(job.status.value for job in jobs) == ["SUCCEEDED"] * len(BACKFILL)
    assert most_at_once([(job.start_time, job.end_time) for job in jobs]) >= 2
    for key in BACKFILL:
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
        "import os, sys; sys.path[:0] = sys.argv[1].split(os.pathsep); import dagster as dg; "
        "from tests.support.dagster_roots import materialize; "
        "from test_compute_ray import _ray_compute\n"
        "with dg.instance_for_test() as instance:\n"
        "    materialize(instance, '00000001', compute=_ray_compute(sys.argv[2], sys.argv[3]))"
    )
    entrypoint = f"{sys.executable} {STAND_IN} hang {pid_file}"

    stderr, worker = interrupted_run(run, [ray_dashboard, entrypoint], pid_file)

    (line,) = [line for line in stderr.splitlines() if "interrupted: stopping Ray job" in line]
    job_id = re.search(r"stopping Ray job (\S+)", line).group(1)  # type: ignore[union-attr]
    client = _client(ray_dashboard)
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


def _finished(jobs: RayJobs, submission_id: str) -> str:
    deadline = time.monotonic() + 120
    while not (state := jobs.state(submission_id)).terminal and time.monotonic() < deadline:
        time.sleep(0.2)
    return state.status


def test_the_jobs_client_sends_rays_token_from_where_ray_looks(
    ray_head: RayHead, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url = ray_head.url
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    job = {"entrypoint": "true"}

    # No credentials: the head refuses, in one line that says what to set.
    with pytest.raises(RayJobsError) as refused:
        RayJobs(url).submit(job)
    assert str(refused.value) == (
        f"the Ray dashboard at {url} refused POST /api/jobs/: HTTP 401 Unauthorized: Missing "
        "authentication token (the head asks for Ray's token: set RAY_AUTH_MODE=token and "
        "$RAY_AUTH_TOKEN, the file $RAY_AUTH_TOKEN_PATH names, or ~/.ray/auth_token)"
    )
    # The token from each place Ray's client looks, in its order, is let in.
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text(f"{ray_head.token}\n")
    from_home = RayJobs(url).submit(job)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / ".ray" / "auth_token"))
    (tmp_path / ".ray" / "auth_token").write_text("not the head's")
    with pytest.raises(RayJobsError, match="HTTP 403 Forbidden: Invalid authentication token"):
        RayJobs(url).state(from_home)
    monkeypatch.setenv("RAY_AUTH_TOKEN", ray_head.token)
    assert _finished(RayJobs(url), from_home) == "SUCCEEDED"


def test_extra_headers_of_the_settings_reach_the_head(
    ray_dashboard: str, roots: Roots, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A step built with the token only in `ray.headers` (as a proxy's Authorization would be).
    token = os.environ["RAY_AUTH_TOKEN"]
    monkeypatch.delenv("RAY_AUTH_MODE")
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    ray = RayCompute(
        address=ray_dashboard,
        entrypoint=f"{sys.executable} {WORKER_FILE}",
        headers={"Authorization": f"Bearer {token}"},
    )
    with dg.instance_for_test() as instance:
        result = materialize(
            instance, "00000001", compute=StepCompute(compute=Compute.ray, ray=ray)
        )

    assert result.success
    assert (roots.output / "step=1" / "manifest.json").is_file()


def test_a_working_dir_with_a_pipeline_folder_does_not_shadow_the_worker(
    ray_dashboard: str, roots: Roots, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    (project / "pipeline").mkdir(parents=True)
    (project / "pipeline" / "__init__.py").write_text("raise ImportError('the job's own')\n")
    runtime_env: dict[str, object] = {"working_dir": str(project)}
    # Uploaded as `ray job submit --working-dir` does; Ray then runs the job in that folder
    # with it first on $PYTHONPATH.
    _client(ray_dashboard)._upload_working_dir_if_needed(runtime_env)

    def build(key: str, entrypoint: str) -> dg.ExecuteInProcessResult:
        ray = RayCompute(address=ray_dashboard, entrypoint=entrypoint, runtime_env=runtime_env)
        with dg.instance_for_test() as instance:
            return materialize(instance, key, compute=StepCompute(compute=Compute.ray, ray=ray))

    # The worker by its path (what the subprocess backend runs), and isolated (the Ray default,
    # here with this interpreter for `python`): both find rollout-shards' own package.
    assert build("00000001", f"{sys.executable} {WORKER_FILE}").success
    assert build("00000002", RAY_ENTRYPOINT.replace("python", sys.executable, 1)).success
    for step in (1, 2):
        assert (roots.output / f"step={step}" / "manifest.json").is_file()
    # The module run plainly imports the working_dir's `pipeline` and the job fails.
    shadowed = build("00000003", f"{sys.executable} -m pipeline.orchestration.pipes_worker")
    assert not shadowed.success
    assert not (roots.output / "step=3").exists()


def test_a_warm_ray_job_builds_every_step_of_a_backfill(
    ray_dashboard: str, roots: Roots, tmp_path: Path
) -> None:
    since_ms = time.time_ns() // 1_000_000
    entrypoint = f"{sys.executable} {WORKER_FILE}"
    with _ray_backfill(
        tmp_path, address=ray_dashboard, entrypoint=entrypoint, warm_worker_s=3.0
    ) as instance:
        runs = instance.get_runs()
        job_ids = {
            record.asset_materialization.metadata["Ray Job ID"].value  # type: ignore[union-attr]
            for run in runs
            for record in instance.all_logs(
                run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
            )
        }
    # One Ray job built every step, then ended on its own once no step came.
    (job_id,) = job_ids
    assert job_id.startswith("rollout-shards-warm-")
    client = _client(ray_dashboard)
    ours = [
        job.submission_id
        for job in client.list_jobs()
        if (job.submission_id or "").startswith("rollout-shards-")
        and (job.start_time or 0) >= since_ms
    ]
    assert ours == [job_id]
    deadline = time.monotonic() + 60
    while not client.get_job_status(job_id).is_terminal() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert client.get_job_status(job_id).value == "SUCCEEDED"
    for key in BACKFILL:
        assert (roots.output / f"step={int(key)}" / "manifest.json").is_file()
    # Nothing is left queued, taken or unread.
    (queue,) = (roots.output / ".ray-workers").iterdir()
    assert [p for p in queue.rglob("*") if p.is_file() and p.parent != queue] == []


def test_a_warm_job_that_dies_building_a_step_fails_it_in_one_line(
    ray_dashboard: str, roots: Roots
) -> None:
    # A warm job that takes the step, then exits 3 without a word.
    dies = (
        "import sys; from pathlib import Path; "
        "from pipeline.orchestration.ray_jobs import WarmQueue; a = sys.argv; "
        'WarmQueue(Path(a[a.index("--serve") + 1])).claim(a[a.index("--job") + 1]); sys.exit(3)'
    )
    ray = RayCompute(
        address=ray_dashboard, entrypoint=f"{sys.executable} -c '{dies}'", warm_worker_s=5.0
    )
    compute = StepCompute(compute=Compute.ray, ray=ray)
    with dg.instance_for_test() as instance:
        result = materialize(instance, "00000001", compute=compute)

    step_key, failure = step_failure(result)
    assert step_key == "rollout_samples"
    assert re.fullmatch(
        r"step 1: warm Ray job rollout-shards-warm-\w+ ended FAILED while building the step; "
        r"its output is in the job's logs",
        failure.description,
    ), failure.description
    assert materialized(result) == []
    # Under the output root only the warm queue, with nothing left queued, taken or unread.
    assert [p.name for p in roots.output.iterdir()] == [".ray-workers"]
    (queue,) = (roots.output / ".ray-workers").iterdir()
    assert [p for p in queue.rglob("*") if p.is_file() and p.parent != queue] == []


def test_a_ray_job_sends_its_step_to_tasks_on_its_cluster(
    ray_dashboard: str,
    ray_head: RayHead,
    roots: Roots,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`compute: ray` with `ray_above: 0`: the Pipes worker, running as a Ray job, has the
    step read and written by Ray tasks on the job's own cluster; the bytes of in process."""
    import requests

    compute = _module_job(ray_dashboard)
    config = {"ops": {"rollout_samples": {"config": {"ray_above": 0}}}}
    with dg.instance_for_test() as instance:
        assert materialize(instance, "00000001", config, compute=compute).success
        in_process = tmp_path / "in-process"
        monkeypatch.setenv("ROLLOUT_SHARDS_OUTPUT", str(in_process))
        assert materialize(instance, "00000001").success
    for name in ("manifest.json", "rank=0.parquet", "rank=1.parquet", "report.html"):
        built = (roots.output / "step=1" / name).read_bytes()
        assert built == (in_process / "step=1" / name).read_bytes()
    # the share reads and the rank writes were submitted as Ray tasks by the job
    answer = requests.get(
        f"{ray_dashboard}/api/v0/tasks",
        params={
            "filter_keys": "func_or_class_name",
            "filter_predicates": "=",
            "filter_values": "_run_call",
            "limit": 1000,
        },
        headers=ray_head.headers(),
        timeout=60,
    )
    assert answer.ok, answer.text[:500]
    # (the head's task events lag behind the tasks: some may still be listed as pending)
    assert answer.json()["data"]["result"]["result"]

"""A step read and written by Ray tasks to an object-store output root (`--ray` with
`--out s3://...`, `step/store_ranks.py`): a three-node cluster on 127.0.0.1
(`tests/orchestration/ray_cluster.py`, Ray's token authentication on) and moto's S3 server
on 127.0.0.1. The cluster starts before the server: its workers reach the store with the
endpoint and credentials the driver hands them, not their own environment's.

The stored files and manifest are byte for byte the in-process local build's; the rank
tasks encode and PUT the rank files on the worker nodes; a worker dying mid-write leaves
no manifest and no file of its attempt, and a rerun commits the same bytes.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.io.discovery import find_sources
from pipeline.io.load import group_steps
from pipeline.settings import Settings
from pipeline.step.build import build_step
from tests.orchestration import ray_cluster
from tests.support.ray_head import start_timeout
from tests.support.s3_server import S3Server, s3_server
from tests.support.samples import build_in_process, step_in_three_files
from tests.support.shared import session_folder

HERE = Path(__file__).resolve().parent
# balance_data: each rank's rows lie in every share, out of batch order
SETTINGS = {"global_batch_size": 64, "dp_size": 4, "balance_data": True}
FLAGS = ["--global-batch-size", "64", "--dp-size", "4", "--balance-data", "--ray-above", "0"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ray_cluster.RayCluster]:
    with ray_cluster.shared(session_folder(tmp_path_factory), start_timeout()) as up:
        yield up


@pytest.fixture(scope="module")
def server(cluster: ray_cluster.RayCluster) -> Iterator[S3Server]:
    """Started after the cluster: no worker has the store's variables of its own."""
    with s3_server() as running:
        yield running


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Step 0 in three files: Parquet of several row groups, Arrow IPC and JSON Lines."""
    return step_in_three_files(tmp_path_factory.mktemp("ray-inputs"))


def _local(inputs: Path, out: Path, settings: dict[str, Any]) -> dict[str, bytes]:
    """The in-process local build's step files, by name."""
    build_in_process(inputs, out, settings)
    return {path.name: path.read_bytes() for path in sorted((out / "step=0").iterdir())}


def _stored(server: S3Server, bucket: str, prefix: str) -> dict[str, bytes]:
    """The stored step's files, by name: the manifest and what it names under its attempt."""
    manifest = server.body(bucket, f"{prefix}/step=0/manifest.json")
    attempt = json.loads(manifest)["manifest_sha256"][:16]
    keys = server.keys(bucket, f"{prefix}/step=0/")
    assert keys == sorted(
        [f"{prefix}/step=0/manifest.json"]
        + [f"{prefix}/step=0/_attempts/{attempt}/rank={r}.parquet" for r in range(4)]
        + [f"{prefix}/step=0/_attempts/{attempt}/report.html"]
    )
    return {key.rpartition("/")[2]: server.body(bucket, key) for key in keys}


def _drive(cluster: ray_cluster.RayCluster, builds: list[dict[str, Any]]) -> dict[str, Any]:
    spec = {"address": cluster.address, "settings": SETTINGS, "builds": builds}
    driver = HERE / "ray_store_driver.py"
    report: dict[str, Any] = ray_cluster.run_driver(cluster, driver, spec, 2 * start_timeout())
    return report


def test_the_cli_builds_a_step_across_the_cluster_into_the_store(
    cluster: ray_cluster.RayCluster, server: S3Server, inputs: Path, tmp_path: Path
) -> None:
    bucket = server.bucket()
    out = f"s3://{bucket}/shards"
    args = ["build", str(inputs), "--out", out, *FLAGS, "--ray", cluster.address]
    result = ray_cluster.run_cli(cluster, args, 2 * start_timeout())
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step 0: 3000 rows in" in result.stdout and out in result.stdout
    assert _stored(server, bucket, "shards") == _local(inputs, tmp_path / "local", SETTINGS)


# The builds of the tests below, run by one driver (one Ray job: its workers start once),
# each into a bucket of its own: a whole build, then per task that dies (encode: nothing was
# PUT yet; put: the other ranks' files are stored, and the failed build removes them) the
# dying build and its rerun.
DYING = {"encode": ("encode_rank_pieces", 2), "put": ("put_object", 3)}


@pytest.fixture(scope="module")
def built_in_one_job(
    cluster: ray_cluster.RayCluster, server: S3Server, inputs: Path
) -> dict[str, tuple[str, dict[str, Any]]]:
    """Per build: its bucket and what it did (`whole`; `encode` and `put`, their dying
    builds, with `... rerun` the builds after them)."""
    buckets = {"whole": server.bucket()} | {name: server.bucket() for name in DYING}
    builds = {"whole": {"inputs": str(inputs), "out": f"s3://{buckets['whole']}/p"}}
    for name, (task, rank) in DYING.items():
        build = {"inputs": str(inputs), "out": f"s3://{buckets[name]}/p"}
        builds[name] = build | {"die_task": task, "die_rank": rank}
        builds[f"{name} rerun"] = build
    report = _drive(cluster, builds=list(builds.values()))
    return {
        name: (buckets[name.partition(" ")[0]], report | done)
        for name, done in zip(builds, report["builds"], strict=True)
    }


def test_rank_tasks_encode_and_put_the_files_on_the_workers(
    cluster: ray_cluster.RayCluster,
    server: S3Server,
    inputs: Path,
    tmp_path: Path,
    built_in_one_job: dict[str, tuple[str, dict[str, Any]]],
) -> None:
    bucket, report = built_in_one_job["whole"]
    assert report["error"] is None
    assert _stored(server, bucket, "p") == _local(inputs, tmp_path / "local", SETTINGS)
    assert report["driver"] == cluster.head
    assert {node for _, node, _ in report["ran"]} == set(cluster.workers)
    tasks = [task for task, _, _ in report["ran"]]
    assert tasks.count("encode_rank_pieces") == 4 and tasks.count("put_object") == 4
    assert "write_rank_pieces" not in tasks


@pytest.mark.parametrize("name", list(DYING))
def test_a_worker_dying_mid_write_leaves_no_manifest_and_no_file(
    server: S3Server,
    inputs: Path,
    tmp_path: Path,
    built_in_one_job: dict[str, tuple[str, dict[str, Any]]],
    name: str,
) -> None:
    """Killed while it encodes its file (nothing was PUT yet) or while it PUTs it (the
    other ranks' files are stored: the failed build removes them)."""
    bucket, died = built_in_one_job[name]
    assert died["error"] is not None and "rule ray_tasks" in died["error"], died
    assert "nothing was published" in died["error"] and "\n" not in died["error"]
    assert died["left"] == []  # nothing stored when the dying build was done
    if name == "put":  # the other ranks' PUTs ran before the one that died
        assert [t for t, _, _ in died["ran"]].count("put_object") == 3

    _, rerun = built_in_one_job[f"{name} rerun"]
    assert rerun["error"] is None
    assert _stored(server, bucket, "p") == _local(inputs, tmp_path / "local", SETTINGS)


def _upload(server: S3Server, bucket: str, folder: Path, prefix: str) -> None:
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            key = f"{prefix}/{path.relative_to(folder)}"
            server.client().put_object(Bucket=bucket, Key=key, Body=path.read_bytes())


def test_inputs_in_the_store_are_read_by_the_tasks(
    cluster: ray_cluster.RayCluster, server: S3Server, inputs: Path, tmp_path: Path
) -> None:
    """`build --ray` and `validate --ray` of inputs in the store: each object one share,
    read by a task; the same bytes and the same report as from the local inputs."""
    bucket = server.bucket()
    _upload(server, bucket, inputs, "rollouts")
    stored_inputs = f"s3://{bucket}/rollouts"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return ray_cluster.run_cli(cluster, list(args), 2 * start_timeout())

    built = run(
        "build", stored_inputs, "--out", f"s3://{bucket}/p", *FLAGS, "--ray", cluster.address
    )
    assert built.returncode == 0, built.stderr[-3000:]
    local = _local(inputs, tmp_path / "local", SETTINGS)
    stored = _stored(server, bucket, "p")
    manifest, expected = (
        json.loads(stored.pop("manifest.json")),
        json.loads(local.pop("manifest.json")),
    )
    assert stored == local  # the rank files
    assert manifest["outputs"] == expected["outputs"] and manifest["counts"] == expected["counts"]
    assert [i["sha256"] for i in manifest["inputs"]] == [i["sha256"] for i in expected["inputs"]]

    checked = ["validate", stored_inputs, "--global-batch-size", "64", "--dp-size", "4"]
    here = run(*checked)
    assert here.returncode == 0, here.stderr
    on_ray = run(*checked, "--ray", cluster.address, "--ray-above", "0")
    assert (on_ray.returncode, on_ray.stdout, on_ray.stderr) == (0, here.stdout, here.stderr)


DAGSTER_DRIVER = """
import json, sys
import dagster as dg
from tests.support.dagster_roots import materialize
config = {"ops": {"rollout_samples": {"config": json.loads(sys.argv[1])}}}
with dg.instance_for_test() as instance:
    print(json.dumps(materialize(instance, "00000003", config).success))
"""


def test_a_dagster_materialization_commits_to_the_store_across_the_cluster(
    cluster: ray_cluster.RayCluster, server: S3Server, tmp_path: Path
) -> None:
    """Both roots in the store, `ray_address` in the run config: the step the command line
    builds from those inputs, byte for byte."""
    from pipeline.orchestration.resources import CONFIG_ENV, INPUT_ENV, OUTPUT_ENV
    from tests.support.samples import REPO

    bucket = server.bucket()
    _upload(server, bucket, REPO / "data" / "rollouts", "rollouts")
    env = cluster.environment() | {
        INPUT_ENV: f"s3://{bucket}/rollouts",
        OUTPUT_ENV: f"s3://{bucket}/shards",
    }
    env.pop(CONFIG_ENV, None)
    config = json.dumps({"ray_address": cluster.address, "ray_above": 0})
    result = ray_cluster.run_python(["-c", DAGSTER_DRIVER, config], env, 2 * start_timeout())
    assert result.returncode == 0 and result.stdout.strip().endswith("true"), result.stderr[-3000:]
    local = tmp_path / "local"
    args = ["-m", "pipeline.cli", "build", f"s3://{bucket}/rollouts", "--out", str(local)]
    built = ray_cluster.run_python(args, env, 600)
    assert built.returncode == 0, built.stderr
    manifest = (local / "step=3" / "manifest.json").read_bytes()
    assert server.body(bucket, "shards/step=3/manifest.json") == manifest
    attempt = json.loads(manifest)["manifest_sha256"][:16]
    ranks = [o["path"] for o in json.loads(manifest)["outputs"] if o["path"].startswith("rank=")]
    assert ranks
    for name in ranks:
        key = f"shards/step=3/_attempts/{attempt}/{name}"
        assert server.body(bucket, key) == (local / "step=3" / name).read_bytes()


def test_a_failed_check_on_what_the_tasks_report_sends_nothing(
    server: S3Server, inputs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's blocking checks run on the tasks' reports before any PUT: a rank whose
    footer disagrees with its rows (here the tasks run in this process) stores nothing."""
    from pipeline.errors import StepError
    from pipeline.io.storage import ObjectRoot
    from pipeline.step import store_ranks
    from pipeline.step.readers.shares import LocalTasks, by_tasks

    monkeypatch.setattr(store_ranks, "footer_rows", lambda _: 1)
    bucket = server.bucket()
    files = group_steps(find_sources([inputs]))[0]
    with pytest.raises(StepError, match="rule shards_verified: .*rank=0.parquet: 1 rows"):
        build_step(
            0,
            files,
            Settings(**SETTINGS),
            ObjectRoot(f"s3://{bucket}/p"),
            route=lambda job: by_tasks(job, LocalTasks()),
        )
    assert server.keys(bucket) == []

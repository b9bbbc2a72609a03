"""A step read and written by Ray tasks (`pipeline.step.ray_ranks`) on a three-node
cluster on 127.0.0.1 (`ray_cluster.py`: a head that runs no task, where the drivers attach,
and two worker nodes; Ray's token authentication on), from the CLI (`--ray ADDRESS`), from
a driver script and from a Dagster materialization: the bytes of the in-process build,
every task on a worker node, and a worker dying mid-step leaves nothing published.

The cluster starts once for this module; every driver is a process of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import ray_cluster

from pipeline.io.discovery import find_sources
from pipeline.io.load import group_steps
from pipeline.settings import Settings
from pipeline.step.build import StepJob, build_step
from tests.support.ray_head import start_timeout
from tests.support.samples import build_in_process, generated_step, step_in_three_files
from tests.support.shared import session_folder

HERE = Path(__file__).resolve().parent
# balance_data: each rank's rows lie in every share, out of batch order
SETTINGS = {"global_batch_size": 64, "dp_size": 4, "balance_data": True}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ray_cluster.RayCluster]:
    with ray_cluster.shared(session_folder(tmp_path_factory), start_timeout()) as up:
        yield up


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Step 0 in three files: Parquet of several row groups, Arrow IPC and JSON Lines."""
    return step_in_three_files(tmp_path_factory.mktemp("ray-inputs"))


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and ".locks" not in path.parts
    }


def _in_process(inputs: Path, out: Path, settings: dict[str, Any]) -> dict[str, bytes]:
    build_in_process(inputs, out, settings)
    return _files(out)


@pytest.fixture(scope="module")
def broken(inputs: Path) -> Path:
    """`inputs` with one row of the Arrow IPC file broken (a response_length of 10**6)."""
    path = inputs.parent / "broken" / "step=0"
    path.mkdir(parents=True, exist_ok=True)
    for source in (inputs / "step=0").iterdir():
        (path / source.name).write_bytes(source.read_bytes())
    table = pl.read_ipc(path / "b.arrow")
    broken = pl.when(pl.int_range(pl.len()) == 7).then(10**6).otherwise("response_length")
    table.with_columns(broken.alias("response_length")).write_ipc(path / "b.arrow")
    return path.parent


def _drive(cluster: ray_cluster.RayCluster, **spec: Any) -> dict[str, Any]:
    spec = {"address": cluster.address, **spec}
    spec = {k: str(v) if isinstance(v, Path) else v for k, v in spec.items()}
    driver = HERE / "ray_driver.py"
    report: dict[str, Any] = ray_cluster.run_driver(cluster, driver, spec, 2 * start_timeout())
    return report


def test_the_cli_builds_a_step_across_the_cluster(
    cluster: ray_cluster.RayCluster, inputs: Path, tmp_path: Path
) -> None:
    flags = ["--global-batch-size", "64", "--dp-size", "4", "--balance-data", "--ray-above", "0"]
    args = ["build", str(inputs), "--out", str(tmp_path / "ray"), *flags, "--ray", cluster.address]
    result = ray_cluster.run_cli(cluster, args, 2 * start_timeout())
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step 0: 3000 rows in" in result.stdout
    assert _files(tmp_path / "ray") == _in_process(inputs, tmp_path / "local", SETTINGS)


# Builds of several tests, run by one driver (one Ray job: its workers start once, where a
# job each would start theirs), each with its inputs and settings. With a broken row
# quarantined, the rows left are trimmed to whole batches, not balanced.
QUARANTINE = {"global_batch_size": 64, "dp_size": 4, "on_invalid": "quarantine"}


@pytest.fixture(scope="module")
def built_in_one_job(
    cluster: ray_cluster.RayCluster,
    inputs: Path,
    broken: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[Path, Path, dict[str, Any], dict[str, Any]]]:
    """Per case: its inputs, its output root, its settings and what its build did. `valid`
    and `quarantined` in shares of a few row groups each, so the Parquet file is read by
    several tasks; `slime` and `verl`: a generated non-compact step with that profile."""
    from tests.support.samples import TRAINERS

    root = tmp_path_factory.mktemp("ray-one-job")
    generated = generated_step(root / "generated", non_compact=True)
    cases = {
        "valid": (inputs, SETTINGS, {"share_bytes": 200 << 10}),
        "quarantined": (broken, QUARANTINE, {"share_bytes": 200 << 10}),
        "slime": (generated, TRAINERS["slime"], {}),
        "verl": (generated, TRAINERS["verl"], {}),
    }
    builds = [
        {"inputs": str(source), "out": str(root / name), "settings": settings, **extra}
        for name, (source, settings, extra) in cases.items()
    ]
    report = _drive(cluster, builds=builds)
    return {
        name: (source, root / name, settings, report | build)
        for (name, (source, settings, _)), build in zip(
            cases.items(), report["builds"], strict=True
        )
    }


@pytest.mark.parametrize("case", ["valid", "quarantined"])
def test_every_task_runs_on_a_worker_node(
    cluster: ray_cluster.RayCluster,
    built_in_one_job: dict[str, tuple[Path, Path, dict[str, Any], dict[str, Any]]],
    tmp_path: Path,
    case: str,
) -> None:
    """With a broken row, its trajectory's lists are read back from the files for the
    quarantine."""
    inputs, out, settings, report = built_in_one_job[case]
    quarantine = case == "quarantined"
    built = _files(out)
    assert report["error"] is None
    assert built == _in_process(inputs, tmp_path / "local", settings)
    assert ("_quarantine/step=0.parquet" in built) is quarantine
    # the driver is on the head; every task ran on a worker node, and both took some
    assert report["driver"] == cluster.head
    assert {node for _, node, _ in report["ran"]} == set(cluster.workers)
    tasks = [task for task, _, _ in report["ran"]]
    assert tasks.count("write_rank_pieces") == 4 and tasks.count("file_digest") == 1
    assert tasks.count("read_share") > 3  # row groups of the Parquet file, the two others
    assert ("share_lists" in tasks) is quarantine


@pytest.mark.parametrize("trainer", ["slime", "verl"])
def test_every_trainer_profile_across_the_cluster(
    cluster: ray_cluster.RayCluster,
    built_in_one_job: dict[str, tuple[Path, Path, dict[str, Any], dict[str, Any]]],
    tmp_path: Path,
    trainer: str,
) -> None:
    inputs, out, settings, report = built_in_one_job[trainer]
    assert report["error"] is None
    assert _files(out) == _in_process(inputs, tmp_path / "local", settings)
    assert {node for _, node, _ in report["ran"]} <= set(cluster.workers)


def test_a_worker_dying_mid_step_publishes_nothing_and_a_rerun_the_same_bytes(
    cluster: ray_cluster.RayCluster, inputs: Path, tmp_path: Path
) -> None:
    out = tmp_path / "ray"
    build = {"inputs": str(inputs), "out": str(out), "settings": SETTINGS}
    # one job: the dying build, then the rerun (its workers started again by Ray)
    died, rerun = _drive(cluster, builds=[build | {"die_rank": 2}, build])["builds"]
    assert died["error"] is not None and "rule ray_tasks" in died["error"], died
    assert "nothing was published" in died["error"] and "\n" not in died["error"]
    # no step folder, no staged one: the output root the failed build made is gone again
    assert died["left"] is None, died["left"]

    assert rerun["error"] is None
    assert _files(out) == _in_process(inputs, tmp_path / "local", SETTINGS)


DAGSTER_DRIVER = """
import json, sys
import dagster as dg
from tests.support.dagster_roots import materialize
config = {"ops": {"rollout_samples": {"config": json.loads(sys.argv[1])}}}
with dg.instance_for_test() as instance:
    print(json.dumps(materialize(instance, "00000001", config).success))
"""


def test_a_dagster_materialization_builds_its_step_across_the_cluster(
    cluster: ray_cluster.RayCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.dagster_roots import configured_roots

    roots = configured_roots(tmp_path / "ray", monkeypatch)  # the driver inherits the roots
    address = cluster.address
    env = cluster.environment() | {"PYTHONPATH": f"{HERE}:{cluster.environment()['PYTHONPATH']}"}
    for name in ("ROLLOUT_SHARDS_INPUT", "ROLLOUT_SHARDS_OUTPUT"):
        env[name] = str(roots.input if name.endswith("INPUT") else roots.output)
    config = json.dumps({"ray_address": address, "ray_above": 0})
    result = ray_cluster.run_python(["-c", DAGSTER_DRIVER, config], env, 2 * start_timeout())
    assert result.returncode == 0 and result.stdout.strip().endswith("true"), result.stderr[-3000:]
    local = tmp_path / "local"
    step = group_steps(find_sources([roots.input]))[1]
    build_step(1, step, Settings(global_batch_size=8, dp_size=2, reward_key="score"), local)
    built = {k: v for k, v in _files(roots.output).items() if k.startswith("step=")}
    assert built == {k: v for k, v in _files(local).items() if k.startswith("step=")}


def test_ray_above_keeps_a_small_step_in_process(inputs: Path, tmp_path: Path) -> None:
    """The route sends a step to the cluster only above `ray_above` MiB of input files; a
    step kept here joins no cluster (the address here reaches none)."""
    from pipeline.step.ray_route import ray_route

    files = group_steps(find_sources([inputs]))[0]
    size = sum(source.path.stat().st_size for source in files)
    settings = Settings(**SETTINGS, ray_address="127.0.0.1:9", ray_above=-(-size >> 20))
    job = StepJob(0, files, settings, tmp_path)
    with ray_route(settings) as route:
        assert route is not None and route(job) is job
    with ray_route(settings.replace(ray_address=None)) as route:
        assert route is None


def test_a_cluster_that_does_not_answer_is_a_usage_error(inputs: Path, tmp_path: Path) -> None:
    """One line and exit 2 at once (Ray's own connect would wait minutes), nothing built."""
    port = ray_cluster.free_port()
    command = [sys.executable, "-m", "pipeline.cli", "build", str(inputs), "--out"]
    flags = ["--global-batch-size", "64", "--ray", f"127.0.0.1:{port}", "--ray-above", "0"]
    result = subprocess.run(
        [*command, str(tmp_path / "out"), *flags], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert result.stderr.startswith("rollout-shards: usage error: cannot reach the Ray cluster")
    assert not (tmp_path / "out" / "step=0").exists()


VALIDATE_CASES = {
    "valid": ("valid", ["--global-batch-size", "64", "--dp-size", "4", "--balance-data"]),
    "broken": ("broken", ["--global-batch-size", "64", "--dp-size", "4"]),
    "quarantined": (
        "broken",
        ["--on-invalid", "quarantine", "--global-batch-size", "64", "--dp-size", "4"],
    ),
    "rows only": ("valid", []),  # the rows alone (no global batch size)
}


def _validate_argv(inputs: Path, broken: Path, name: str) -> list[str]:
    case, flags = VALIDATE_CASES[name]
    return [str(broken if case == "broken" else inputs), *flags]


@pytest.fixture(scope="module")
def validated_on_the_cluster(
    cluster: ray_cluster.RayCluster, inputs: Path, broken: Path
) -> dict[str, dict[str, Any]]:
    """Every case's `validate --ray` run by one driver (which records the tasks), as the
    command line runs it: its exit status, stdout and stderr, per case."""
    on_ray = ["--ray", cluster.address, "--ray-above", "0"]
    runs = [_validate_argv(inputs, broken, name) + on_ray for name in VALIDATE_CASES]
    report = _drive(cluster, validate=runs)
    return dict(zip(VALIDATE_CASES, report["runs"], strict=True))


@pytest.mark.parametrize("name", list(VALIDATE_CASES))
def test_validate_on_the_cluster_says_what_it_says_in_process(
    cluster: ray_cluster.RayCluster,
    inputs: Path,
    broken: Path,
    validated_on_the_cluster: dict[str, dict[str, Any]],
    name: str,
) -> None:
    """`validate --ray`: its reads and checks run as tasks on the cluster, and its output
    and exit status are the in-process run's (a process of its own)."""
    argv = _validate_argv(inputs, broken, name)
    here = ray_cluster.run_cli(cluster, ["validate", *argv], 2 * start_timeout())
    refused = name == "broken"
    assert here.returncode == (1 if refused else 0), here
    there = validated_on_the_cluster[name]
    assert (there["status"], there["stdout"], there["stderr"]) == (
        here.returncode,
        here.stdout,
        here.stderr,
    )
    tasks = {task for task, _, _ in there["ran"]}
    assert "read_share" in tasks and not tasks & {"split_share", "write_rank_pieces"}
    assert {node for _, node, _ in there["ran"]} <= set(cluster.workers)

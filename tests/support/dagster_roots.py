"""Shared set-up of the Dagster tests: a copy of the embedded steps as the configured roots."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl
import pytest

from pipeline.definitions import defs
from pipeline.orchestration.compute import StepCompute
from pipeline.orchestration.partitions import rollout_steps
from pipeline.orchestration.resources import CONFIG_ENV, INPUT_ENV, OUTPUT_ENV, RolloutStorage

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "data" / "rollouts"
ASSETS = list(defs.assets or [])
# every check is a check spec of the step's op (no separate check steps)
CHECK_KEYS = [spec.key for asset in ASSETS for spec in asset.check_specs]
EMBEDDED_KEYS = ["00000001", "00000002", "00000003", "00000004"]


@dataclass
class Roots:
    input: Path
    output: Path


def makefile_instance(home: Path) -> Path:
    """The Dagster instance `make run` and `make ui` use: `home` holding the dagster.yaml
    the Makefile's `$(DAGSTER_HOME)/dagster.yaml` rule writes."""
    home.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["make", "-s", f"DAGSTER_HOME={home}", str(home / "dagster.yaml")],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    return home


def configured_roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Roots:
    """A copy of data/rollouts as ROLLOUT_SHARDS_INPUT and an empty ROLLOUT_SHARDS_OUTPUT."""
    roots = Roots(input=tmp_path / "rollouts", output=tmp_path / "shards")
    shutil.copytree(DATA, roots.input)
    monkeypatch.setenv(INPUT_ENV, str(roots.input))
    monkeypatch.setenv(OUTPUT_ENV, str(roots.output))
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    return roots


def materialize(
    instance: dg.DagsterInstance,
    key: str,
    run_config: dict[str, Any] | None = None,
    selection: dg.AssetSelection | None = None,
    compute: StepCompute | None = None,
) -> dg.ExecuteInProcessResult:
    """Materialize one step's assets and checks in process, as the job would; the stages run
    where `compute` says (default: in process)."""
    if not instance.has_dynamic_partition(rollout_steps.name, key):
        instance.add_dynamic_partitions(rollout_steps.name, [key])
    return dg.materialize(
        ASSETS,
        partition_key=key,
        instance=instance,
        resources={
            "rollout_storage": RolloutStorage.from_env(),
            "step_compute": compute or StepCompute(),
        },
        run_config=run_config,
        selection=selection,
        raise_on_error=False,
    )


def metadata_of(result: dg.ExecuteInProcessResult, asset: str) -> dict[str, Any]:
    """The metadata of the run's one materialization of `asset` (the three assets of a
    step come from one Dagster step, so they are told apart by key, not by node)."""
    (event,) = [
        e.materialization
        for e in result.get_asset_materialization_events()
        if e.asset_key == dg.AssetKey(asset)
    ]
    return dict(event.metadata)


def materialized(result: dg.ExecuteInProcessResult) -> list[str]:
    """The assets the run materialized, in the order it did."""
    return [e.asset_key.to_user_string() for e in result.get_asset_materialization_events()]


def break_step_1(roots: Roots) -> None:
    """Two rows of step 1 claim a response longer than their tokens."""
    path = roots.input / "step=1.parquet"
    frame = pl.read_parquet(path)
    frame.with_columns(
        pl.when(pl.col("index").is_in([2, 5]))
        .then(pl.lit(999, dtype=pl.Int32))
        .otherwise(pl.col("response_length"))
        .alias("response_length")
    ).write_parquet(path)


def run_checks(instance: dg.DagsterInstance, key: str) -> dg.ExecuteInProcessResult:
    """Only the asset checks of `training_shards` on one step, as "Execute checks" in the UI."""
    job = defs.resolve_job_def("rollout_step_job")
    subset = job.get_subset(asset_selection=set(), asset_check_selection=set(CHECK_KEYS))
    return subset.execute_in_process(
        partition_key=key,
        instance=instance,
        resources={"rollout_storage": RolloutStorage.from_env(), "step_compute": StepCompute()},
        raise_on_error=False,
    )


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most spans (start, end) open at one moment."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = peak = 0
    for _, change in edges:
        running += change
        peak = max(peak, running)
    return peak


def step_failure(result: dg.ExecuteInProcessResult) -> tuple[str, dg.Failure]:
    """The key and the user's failure of the run's one failed step."""
    (event,) = [e for e in result.all_events if e.is_step_failure]
    return event.step_key, event.step_failure_data.user_failure_data


def failed_in_one_line(result: dg.ExecuteInProcessResult, pattern: str, output: Path) -> None:
    """The run failed at its step with one line matching `pattern`, no asset materialized
    and nothing written under `output`."""
    step_key, failure = step_failure(result)
    assert step_key == "rollout_samples"
    assert "\n" not in failure.description
    assert re.fullmatch(pattern, failure.description), failure.description
    assert materialized(result) == []
    assert not output.exists()


ORCHESTRATION = Path(__file__).resolve().parents[1] / "orchestration"
STAND_IN = ORCHESTRATION / "stand_in_worker.py"


def stand_in_run(
    instance: dg.DagsterInstance, compute: StepCompute
) -> tuple[dg.ExecuteInProcessResult, list[str]]:
    """Step 1's assets alone (no checks: a stand-in worker writes nothing) where `compute`
    says, and the run's log messages."""
    if not instance.has_dynamic_partition(rollout_steps.name, "00000001"):
        instance.add_dynamic_partitions(rollout_steps.name, ["00000001"])
    result = dg.materialize(
        ASSETS,
        partition_key="00000001",
        instance=instance,
        resources={"rollout_storage": RolloutStorage.from_env(), "step_compute": compute},
        selection=dg.AssetSelection.all().without_checks(),
    )
    return result, [record.user_message for record in instance.all_logs(result.run_id)]


def interrupted_run(code: str, args: list[str], pid_file: Path) -> tuple[str, int]:
    """Run `code` in a child interpreter (`sys.argv[1]` is the search path of the tests:
    tests/orchestration and the repository, joined by os.pathsep; then `args`): a
    materialization whose stand-in worker writes its pid to `pid_file`. Once the worker
    runs, interrupt the child as Ctrl-C would; returns the child's stderr and the worker's
    pid."""
    runner = subprocess.Popen(
        [sys.executable, "-c", code, os.pathsep.join([str(ORCHESTRATION), str(REPO)]), *args],
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline and runner.poll() is None:
        time.sleep(0.05)
    worker = int(pid_file.read_text())
    runner.send_signal(signal.SIGINT)
    _, stderr = runner.communicate(timeout=60)
    return stderr, worker


def failed_at_the_batch(result: dg.ExecuteInProcessResult, roots: Roots, step: int) -> None:
    """One Dagster step builds the three assets: the samples were valid and are
    materialized, the batch failed, and nothing after it ran or was written."""
    step_key, failure = step_failure(result)
    assert step_key == "rollout_samples"
    assert materialized(result) == ["rollout_samples"]
    assert f"step {step}" in (failure.description or "")
    assert not (roots.output / f"step={step}").exists()


def written_step(roots: Roots, step: int) -> dict[str, Any]:
    """The manifest of step `step`'s folder, which holds it, two rank files and the report."""
    folder = roots.output / f"step={step}"
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["manifest.json", "rank=0.parquet", "rank=1.parquet", "report.html"]
    manifest: dict[str, Any] = json.loads((folder / "manifest.json").read_text())
    return manifest


# pipeline.orchestration.compute silences these two warnings of Dagster's own Pipes code, but
# pytest drops the filters a module sets while it is collected: each Pipes test module's
# `pytestmark` starts with them.
PIPES_WARNINGS = [
    pytest.mark.filterwarnings("ignore:Function `PipesMessageReader.expected_writer_count`"),
    pytest.mark.filterwarnings("ignore:AssetExecutionContext.run_id is deprecated"),
]

"""Rank-by-rank writes give exactly what a write of the whole frame gives.

Reading a file's list columns on threads of their own, gathering the list columns rank by
rank as the files are written, and the import layout of the CLI are checked here for
their results; how fast they are is measured by bench/run.py, never asserted.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from pipeline.io.discovery import find_sources
from pipeline.io.load import group_steps
from pipeline.manifest import Manifest
from pipeline.orchestration import stage_reports as stages
from pipeline.settings import Settings
from pipeline.step import staging
from pipeline.step.plan import plan_batch
from pipeline.step.readers.memory import load_samples
from pipeline.step.roots import StepRoots
from pipeline.step.write import write_shards
from tests.support.samples import generated_step

REPO = Path(__file__).resolve().parents[2]


def _generate(folder: Path, samples: int, non_compact: bool = False) -> Path:
    return generated_step(folder, samples, non_compact)


@pytest.fixture(scope="module")
def step_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _generate(tmp_path_factory.mktemp("lean") / "rollouts", 3000)


def _digests(manifest: Manifest) -> list[str]:
    return [output.sha256 for output in manifest.outputs]


@pytest.mark.parametrize(
    "settings",
    [
        {"global_batch_size": 64, "dp_size": 4},
        {"global_batch_size": 63, "dp_size": 3, "balance_data": True},
        {
            "global_batch_size": 32,
            "dp_size": 2,
            "cp_size": 1,
            "max_tokens_per_gpu": 8192,
            "use_dynamic_batch_size": True,
        },
    ],
    ids=["strided", "balanced", "schedule"],
)
def test_rank_by_rank_writes_equal_writes_of_the_whole_frame(
    step_dir: Path, tmp_path: Path, settings: dict
) -> None:
    """The CLI gathers each rank's rows as it writes them; a Dagster run writes from the
    staged whole frame. Both give the same files, byte for byte, and the same rows."""
    config = Settings(**settings)
    samples = load_samples(0, group_steps(find_sources([step_dir]))[0], config)
    lean = plan_batch(samples, config)
    lean_manifest = write_shards(lean, tmp_path / "lean")
    whole = plan_batch(samples, config)
    roots = StepRoots(input_root=step_dir, output_root=tmp_path / "whole")
    staging.save_batch(roots, whole)
    whole_manifest = write_shards(staging.load_batch(roots, 0), tmp_path / "whole")
    assert _digests(lean_manifest) == _digests(whole_manifest)
    assert lean_manifest.counts == whole_manifest.counts
    frame = whole.frame
    for rank in range(config.dp_size):
        written = pl.read_parquet(tmp_path / "lean" / "step=0" / f"rank={rank}.parquet")
        expected = frame.filter(pl.col("rank") == rank)
        assert written.equals(expected)


@pytest.mark.parametrize("balance_data", [False, True])
def test_the_batch_report_does_not_gather_the_batch(step_dir: Path, balance_data: bool) -> None:
    """train_batch's metadata (row count, column schema) comes from the lean batch: a Dagster
    run or Pipes worker holds no second, write-ordered copy of the step's tokens."""
    config = Settings(global_batch_size=64, dp_size=4, balance_data=balance_data)
    batch = plan_batch(load_samples(0, group_steps(find_sources([step_dir]))[0], config), config)

    report = stages._batch_report(batch, None)

    assert batch._frame is None  # nothing gathered
    frame = batch.frame
    assert report.metadata["dagster/partition_row_count"] == stages.scalar(frame.height)
    assert report.metadata["dagster/column_schema"] == stages.column_schema(frame.schema)
    assert (batch.height, batch.schema) == (frame.height, frame.schema)


def test_reruns_write_the_same_bytes(step_dir: Path, tmp_path: Path) -> None:
    config = Settings(global_batch_size=64, dp_size=4)
    sources = group_steps(find_sources([step_dir]))[0]
    first = write_shards(plan_batch(load_samples(0, sources, config), config), tmp_path / "a")
    second = write_shards(plan_batch(load_samples(0, sources, config), config), tmp_path / "b")
    assert _digests(first) == _digests(second)


def test_the_cli_imports_neither_dagster_nor_pandera_up_front() -> None:
    """Dagster is for the orchestrated path only; Pandera is imported on a second thread
    while the first files are read (see `readers.memory.load_samples`)."""
    code = "import sys, pipeline.cli; print(sorted({'dagster', 'pandera'} & set(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert result.stdout.strip() == "[]"

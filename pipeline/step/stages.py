"""What each asset of a step computes, without Dagster: the same code in process or in a
Pipes worker (`pipeline.orchestration.pipes_worker`) on another process, Ray node or Kubernetes pod.

A stage reads its input (the step's tables, or the previous stage's staging folder), calls
the core (`load_samples`, `plan_batch`, `write_shards`), writes its output and returns a
`StageReport`: one log line and the materialization metadata in the Pipes wire format
(`{"type": ..., "raw_value": ...}`), which `pipeline.orchestration.reporting.dagster_metadata`
turns into Dagster's metadata values in process and Dagster Pipes does for a worker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from pipeline import columns as c
from pipeline.errors import UsageError
from pipeline.manifest import Manifest
from pipeline.settings import Settings
from pipeline.step import ROLLOUT_SAMPLES, TRAIN_BATCH, TRAINING_SHARDS, staging
from pipeline.step.ingest import PROVENANCE, load_samples
from pipeline.step.plan import plan_batch
from pipeline.step.roots import StepRoots
from pipeline.step.write import write_shards

Metadata = dict[str, dict[str, Any]]


@dataclass
class StageReport:
    """What a stage tells Dagster: a log line with its counts, and its metadata."""

    log: str
    metadata: Metadata


def scalar(value: bool | int | float | str | None) -> dict[str, Any]:
    """A plain value with its metadata type (bool before int: True is an int too)."""
    if value is None:
        return {"type": "null", "raw_value": None}
    if isinstance(value, bool):
        return {"type": "bool", "raw_value": value}
    if isinstance(value, int):
        return {"type": "int", "raw_value": value}
    if isinstance(value, float):
        return {"type": "float", "raw_value": value}
    return {"type": "text", "raw_value": str(value)}


def json_value(value: Any) -> dict[str, Any]:
    return {"type": "json", "raw_value": value}


def path_value(path: Path) -> dict[str, Any]:
    return {"type": "path", "raw_value": str(path)}


def _columns(
    types: dict[str, str], descriptions: dict[str, str] | None = None
) -> list[dict[str, str]]:
    described = descriptions or {}
    columns = [{"name": name, "type": kind} for name, kind in types.items()]
    for column in columns:
        if column["name"] in described:
            column["description"] = described[column["name"]]
    return columns


def column_schema(
    frame: pl.DataFrame, descriptions: dict[str, str] | None = None
) -> dict[str, Any]:
    """The frame's columns and types, with a description for each column that has one."""
    columns = {name: str(dtype) for name, dtype in frame.schema.items()}
    return {"type": "table_schema", "raw_value": {"columns": _columns(columns, descriptions)}}


def table(records: list[dict[str, Any]], types: dict[str, str]) -> dict[str, Any]:
    return {"type": "table", "raw_value": {"records": records, "schema": _columns(types)}}


def _layout(meta: Manifest) -> Metadata:
    return {
        **{name: scalar(count) for name, count in meta.counts.model_dump().items()},
        "is_compact": scalar(meta.is_compact),
        "global_batch_size": scalar(meta.global_batch_size),
        "dynamic_global_batch_size": scalar(meta.dynamic_global_batch_size),
        "num_train_steps": scalar(meta.num_train_steps),
        "num_rollouts": json_value(meta.num_rollouts),
    }


def _rollout_metrics(meta: Manifest) -> Metadata:
    """The step's rollout metrics as float metadata: the asset's Plots tab charts them."""
    return {name: scalar(float(value)) for name, value in meta.stats.items()}


def rollout_samples_stage(roots: StepRoots, step: int, settings: Settings | None) -> StageReport:
    """Read, type, repair and validate the step; stage the valid rows with their settings."""
    if settings is None:
        raise UsageError(f"step {step}: {ROLLOUT_SAMPLES} needs the run's settings")
    samples = load_samples(step, roots.step_sources(step), settings)
    folder = staging.save_samples(roots, samples, settings)
    inputs = [
        {"path": i["path"], "rows": i["rows"], "sha256": i["sha256"][:16]} for i in samples.inputs
    ]
    quarantined = samples.quarantine.height if samples.quarantine is not None else 0
    return StageReport(
        log=(
            f"step {step}: {samples.ingested} rows read, {samples.frame.height} valid, "
            f"{sum(samples.repaired.values())} repaired"
        ),
        metadata={
            "dagster/partition_row_count": scalar(samples.frame.height),
            "dagster/column_schema": column_schema(samples.frame.drop(PROVENANCE, strict=False)),
            "ingested": scalar(samples.ingested),
            "quarantined": scalar(quarantined),
            "repaired": json_value(samples.repaired),
            "ignored_columns": json_value(samples.ignored_columns),
            "inputs": table(inputs, {"path": "string", "rows": "int", "sha256": "string"}),
            "staged": path_value(folder),
        },
    )


def train_batch_stage(roots: StepRoots, step: int, settings: Settings | None = None) -> StageReport:
    """Plan the staged samples with the settings staged beside them; stage the batch."""
    samples, staged_settings = staging.load_samples(roots, step)
    batch = plan_batch(samples, staged_settings)
    folder = staging.save_batch(roots, batch)
    counts = batch.meta.counts
    return StageReport(
        log=(
            f"step {step}: {counts.trimmed} trimmed, {counts.dropped} dropped, "
            f"{counts.written} to write in {batch.meta.num_train_steps} train steps"
        ),
        metadata={
            "dagster/partition_row_count": scalar(batch.frame.height),
            "dagster/column_schema": column_schema(batch.frame),
            **_layout(batch.meta),
            "num_microbatches": json_value(batch.meta.num_microbatches),
            "equal_reward_groups": scalar(batch.meta.equal_reward_groups),
            "staged": path_value(folder),
        },
    )


def training_shards_stage(
    roots: StepRoots, step: int, settings: Settings | None = None
) -> StageReport:
    """Write the staged batch as the committed step folder."""
    batch = staging.load_batch(roots, step)
    manifest = write_shards(batch, roots.output_root)
    folder = roots.step_folder(step)
    ranks = [{"file": o.path, "rows": o.rows, "tokens": o.tokens} for o in manifest.rank_outputs()]
    return StageReport(
        log=f"step {step}: {manifest.counts.written} rows written to {folder}",
        metadata={
            "dagster/partition_row_count": scalar(manifest.counts.written),
            "dagster/column_schema": column_schema(batch.frame, c.DATASET_DESCRIPTIONS),
            **_layout(manifest),
            "present_columns": json_value(manifest.present_columns),
            "ranks": table(ranks, {"file": "string", "rows": "int", "tokens": "int"}),
            **_rollout_metrics(manifest),
            "path": path_value(folder),
        },
    )


Stage = Callable[[StepRoots, int, "Settings | None"], StageReport]

STAGE_FUNCTIONS: dict[str, Stage] = {
    ROLLOUT_SAMPLES: rollout_samples_stage,
    TRAIN_BATCH: train_batch_stage,
    TRAINING_SHARDS: training_shards_stage,
}


def run_stage(name: str, roots: StepRoots, step: int, settings: Settings | None) -> StageReport:
    """Run the stage of the asset `name` on one step."""
    if name not in STAGE_FUNCTIONS:
        raise UsageError(f"unknown stage {name!r}; one of {', '.join(STAGE_FUNCTIONS)}")
    return STAGE_FUNCTIONS[name](roots, step, settings)

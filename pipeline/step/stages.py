"""What each asset of a step computes, without Dagster: the same code in process or in a
Pipes worker (`pipeline.orchestration.pipes_worker`) on another process, Ray node or Kubernetes pod.

`run_stages` runs the selected stages of a step in order through the one driver
(`build.run_step`): the first reads the step's tables (or the previous stage's staging
folder when that stage ran on its own), each stage takes what the one before handed it in
memory, and each yields a `StageReport`: one
log line and the materialization metadata in the Pipes wire format (`{"type": ...,
"raw_value": ...}`), which `pipeline.orchestration.reporting.dagster_metadata` turns into
Dagster's metadata values in process and Dagster Pipes does for a worker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from pipeline import columns as c
from pipeline.errors import UsageError
from pipeline.io import writer
from pipeline.manifest import Manifest
from pipeline.settings import Settings, make_settings
from pipeline.step import ROLLOUT_SAMPLES, STAGES, TRAIN_BATCH, TRAINING_SHARDS, staging
from pipeline.step.build import StepJob, run_step
from pipeline.step.check import PROVENANCE
from pipeline.step.roots import StepRoots
from pipeline.step.tables import SampleTable, TrainBatch

Metadata = dict[str, dict[str, Any]]

# What each column of a step's rows holds, from the contract's column table: the
# `rollout_samples` column schema in the UI shows these.
INPUT_DESCRIPTIONS = {col.name: col.description for col in c.INPUT_COLUMNS}


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


def column_schema(schema: pl.Schema, descriptions: dict[str, str] | None = None) -> dict[str, Any]:
    """A frame's columns and types, with a description for each column that has one."""
    columns = {name: str(dtype) for name, dtype in schema.items()}
    return {"type": "table_schema", "raw_value": {"columns": _columns(columns, descriptions)}}


def table(records: list[dict[str, Any]], types: dict[str, str]) -> dict[str, Any]:
    return {"type": "table", "raw_value": {"records": records, "schema": _columns(types)}}


def _layout(meta: Manifest) -> Metadata:
    """The step's row counts and batch layout as two tables of one line per name. The Plots
    tab charts every numeric entry in the alphabetical order of its key, so scalar counts
    would come before the rollout metrics: tables keep them in view and out of the charts,
    and one line per name keeps them narrow."""
    layout = {
        "is_compact": meta.is_compact,
        "global_batch_size": meta.global_batch_size,
        "dynamic_global_batch_size": meta.dynamic_global_batch_size,
        "num_train_steps": meta.num_train_steps,
    }
    return {
        "rows": _name_table(meta.counts.to_dict(), "rows", "int"),
        "layout": _name_table(layout, "value", "scalar"),
        "num_rollouts": json_value(meta.num_rollouts),
    }


def _name_table(values: dict[str, Any], column: str, kind: str) -> dict[str, Any]:
    records = [{"name": name, column: value} for name, value in values.items()]
    return table(records, {"name": "string", column: kind})


ROLLOUT_PREFIX = "rollout/"


def metric_key(name: str) -> str:
    """A rollout metric's metadata key: its name without miles' `rollout/` prefix, which every
    key would repeat and which makes the longest keys overrun their values in the UI."""
    return name.removeprefix(ROLLOUT_PREFIX)


def _rollout_metrics(meta: Manifest) -> Metadata:
    """The step's rollout metrics as float metadata: the asset's Plots tab charts them."""
    return {metric_key(name): scalar(float(value)) for name, value in meta.stats.items()}


def _samples_report(samples: SampleTable, staged: Path | None) -> StageReport:
    inputs = [
        {"path": i["path"], "rows": i["rows"], "sha256": i["sha256"][:16]} for i in samples.files
    ]
    quarantined = samples.quarantine.height if samples.quarantine is not None else 0
    return StageReport(
        log=(
            f"step {samples.step}: {samples.ingested} rows read, {samples.frame.height} valid, "
            f"{sum(samples.repaired.values())} repaired"
        ),
        metadata={
            "dagster/partition_row_count": scalar(samples.frame.height),
            "dagster/column_schema": column_schema(
                pl.Schema(
                    (name, dtype)
                    for name, dtype in samples.schema.items()
                    if name not in PROVENANCE
                ),
                INPUT_DESCRIPTIONS,
            ),
            "ingested": scalar(samples.ingested),
            "quarantined": scalar(quarantined),
            "repaired": json_value(samples.repaired),
            "ignored_columns": json_value(samples.ignored_columns),
            "inputs": table(inputs, {"path": "string", "rows": "int", "sha256": "string"}),
            **_staged(staged),
        },
    )


def _batch_report(batch: TrainBatch, staged: Path | None) -> StageReport:
    counts = batch.meta.counts
    return StageReport(
        log=(
            f"step {batch.step}: {counts.trimmed} trimmed, {counts.dropped} dropped, "
            f"{counts.written} to write in {batch.meta.num_train_steps} train steps"
        ),
        metadata={
            # height and schema without gathering the list columns into write order (a
            # second copy of the step's tokens): write_shards gathers one rank at a time.
            "dagster/partition_row_count": scalar(batch.height),
            "dagster/column_schema": column_schema(batch.schema),
            **_layout(batch.meta),
            "num_microbatches": json_value(batch.meta.num_microbatches),
            "equal_reward_groups": scalar(batch.meta.equal_reward_groups),
            **_staged(staged),
        },
    )


def _shards_report(batch: TrainBatch, manifest: Manifest, folder: Path) -> StageReport:
    ranks = [{"file": o.path, "rows": o.rows, "tokens": o.tokens} for o in manifest.rank_outputs()]
    return StageReport(
        log=f"step {manifest.step}: {manifest.counts.written} rows written to {folder}",
        # The rollout metrics first: what a user follows across steps heads the table.
        metadata={
            **_rollout_metrics(manifest),
            "dagster/partition_row_count": scalar(manifest.counts.written),
            "dagster/column_schema": column_schema(batch.schema, c.DATASET_DESCRIPTIONS),
            **_layout(manifest),
            "present_columns": json_value(manifest.present_columns),
            "ranks": table(ranks, {"file": "string", "rows": "int", "tokens": "int"}),
            "path": path_value(folder),
        },
    )


def _staged(folder: Path | None) -> Metadata:
    """The staging folder of an asset, shown only when the asset was staged."""
    return {"staged": path_value(folder)} if folder is not None else {}


def selected_stages(names: Iterable[str]) -> list[str]:
    """The selected assets in the order their stages run; an unknown name is refused."""
    chosen = set(names)
    unknown = sorted(chosen - set(STAGES))
    if unknown:
        raise UsageError(f"unknown stage {unknown[0]!r}; one of {', '.join(STAGES)}")
    return [name for name in STAGES if name in chosen]


def run_stages(
    names: Iterable[str],
    roots: StepRoots,
    step: int,
    settings: Settings | None,
    route: Callable[[StepJob], StepJob] | None = None,
) -> Iterator[tuple[str, StageReport]]:
    """Run the selected stages of one step in order, yielding each asset's report as soon
    as it is done. What one stage hands the next stays in memory; an output is staged only
    when the next stage is not selected (it will run on its own, later), and a staged copy
    that this run supersedes without staging is removed, so a later stage run on its own
    never reads a stale one. A stage whose input is not produced here reads it from staging.
    The run holds the step's lock (`writer.step_lock`), as a CLI build does. `route` may
    give a run from the read through the write another reader and writer (Ray tasks,
    `orchestration/ray_ranks.py`)."""
    stages = selected_stages(names)
    with writer.step_lock(roots.output_root, step):
        yield from _run_selected(stages, roots, step, settings, route)


def _runs(stages: list[str]) -> list[list[str]]:
    """The selected stages as runs of consecutive stages (`STAGES` order)."""
    runs: list[list[str]] = []
    for name in stages:
        if runs and STAGES.index(name) == STAGES.index(runs[-1][-1]) + 1:
            runs[-1].append(name)
        else:
            runs.append([name])
    return runs


def _run_selected(
    stages: list[str],
    roots: StepRoots,
    step: int,
    settings: Settings | None,
    route: Callable[[StepJob], StepJob] | None,
) -> Iterator[tuple[str, StageReport]]:
    for run in _runs(stages):
        first, last = run[0], run[-1]
        given: SampleTable | TrainBatch | None = None
        run_settings = settings
        if first == ROLLOUT_SAMPLES and settings is None:
            raise UsageError(f"step {step}: {ROLLOUT_SAMPLES} needs the run's settings")
        if first == TRAIN_BATCH:
            given, run_settings = staging.load_samples(roots, step)  # planned as validated
        elif first == TRAINING_SHARDS:
            given = staging.load_batch(roots, step)
            run_settings = run_settings or make_settings(given.meta.settings)
        assert run_settings is not None
        sources = roots.step_sources(step) if first == ROLLOUT_SAMPLES else []
        job = StepJob(step, sources, run_settings, roots.output_root)
        if route is not None and (first, last) == (ROLLOUT_SAMPLES, TRAINING_SHARDS):
            job = route(job)
        batch = given if isinstance(given, TrainBatch) else None
        for name, value in run_step(job, first, last, given):
            # the next stage takes this one's output in memory, or a later run of its own
            # takes it from staging
            hand_on = name != last
            if isinstance(value, SampleTable):
                staged = _hand_on_or_stage(
                    hand_on, roots, name, step, staging.save_samples, value, run_settings
                )
                yield name, _samples_report(value, staged)
            elif isinstance(value, TrainBatch):
                staged = _hand_on_or_stage(hand_on, roots, name, step, staging.save_batch, value)
                batch = value
                yield name, _batch_report(value, staged)
            else:
                assert batch is not None and isinstance(value, Manifest)
                yield name, _shards_report(batch, value, roots.step_folder(step))
            del value


def _hand_on_or_stage(
    hand_on: bool,
    roots: StepRoots,
    asset: str,
    step: int,
    save: Callable[..., Path],
    *value: Any,
) -> Path | None:
    """Stage an asset for a later run of its downstream stage, or (handed on in memory)
    remove what an earlier run staged for it, which this run has superseded."""
    if hand_on:
        staging.discard(roots, asset, step)
        return None
    return save(roots, *value)

"""What Dagster shows of a stage (`pipeline.step.stages.StageDone`): a log line with its
counts and the materialization metadata in the Pipes wire format (`{"type": ...,
"raw_value": ...}`), which `reporting.dagster_metadata` turns into Dagster's metadata
values in process and Dagster Pipes does for a worker. Dagster itself is not imported:
a Pipes worker formats its reports with this module alone."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import polars as pl

from pipeline import columns as c
from pipeline.manifest import Manifest
from pipeline.report.embed import figures_markdown
from pipeline.report.serve import URL_ENV
from pipeline.step.check import PROVENANCE
from pipeline.step.stages import StageDone
from pipeline.step.tables import SampleTable, TrainBatch

Metadata = dict[str, dict[str, Any]]
# resources.OUTPUT_ENV and its default: resources imports Dagster, which a Pipes worker
# formatting its reports does not load
OUTPUT_ENV = "ROLLOUT_SHARDS_OUTPUT"
DEFAULT_OUTPUT = "data/shards"

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
            **_report(manifest, folder),
        },
    )


def report_url(page: Path) -> str:
    """Where the UI links a step's report: under `ROLLOUT_SHARDS_REPORT_URL` where the
    reports are served (`rollout-shards report ROOT --serve`, or a store's https endpoint),
    by the page's path under the output root; else its `file://` URI, which a browser opens
    only when pasted or opened in a tab of its own (docs/report.md)."""
    base = os.environ.get(URL_ENV, "").strip().rstrip("/")
    if not base:
        return page.as_uri()
    root = Path(os.environ.get(OUTPUT_ENV) or DEFAULT_OUTPUT).resolve()
    try:
        under = page.resolve().relative_to(root).as_posix()
    except ValueError:  # a folder outside the configured root: its step folder and page
        under = f"{page.parent.name}/{page.name}"
    return f"{base}/{quote(under, safe='/=')}"


def _report(manifest: Manifest, folder: Path) -> Metadata:
    """The step's report page (a link, and its figures inline), or null for a step built
    without one (`manifest.report` null: by a version that needed the `report` extra for
    it, or one before reports)."""
    if manifest.report is None:
        return {"report": scalar(None)}
    page = (folder / manifest.report).absolute()
    url = report_url(page)
    return {
        "report": {"type": "url", "raw_value": url},
        "report_figures": {"type": "md", "raw_value": figures_markdown(page, url)},
    }


def _staged(folder: Path | None) -> Metadata:
    """The staging folder of an asset, shown only when the asset was staged."""
    return {"staged": path_value(folder)} if folder is not None else {}


def stage_report(done: StageDone) -> StageReport:
    """The report of one computed asset."""
    if isinstance(done.value, SampleTable):
        return _samples_report(done.value, done.staged)
    if isinstance(done.value, TrainBatch):
        return _batch_report(done.value, done.staged)
    assert done.batch is not None
    return _shards_report(done.batch, done.value, done.folder)

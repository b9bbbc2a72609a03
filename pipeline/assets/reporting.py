"""What the assets show in the UI: materialization metadata and failure summaries."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl

from pipeline import columns as c
from pipeline.build import PROVENANCE, SampleTable, TrainBatch
from pipeline.errors import StepError, UsageError, Violation
from pipeline.io import writer

ROWS_SHOWN = 20
FAILURE_TAG = "rollout_shards/invalid"


def _md_cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(_md_cell(v) for v in row) + " |" for row in rows),
    ]
    return "\n".join(lines)


def violation_metadata(violations: Sequence[Violation]) -> dict[str, Any]:
    """Rows per rule, and the first offending rows as a Markdown table."""
    per_rule: dict[str, int] = {}
    for violation in violations:
        per_rule[violation.rule] = per_rule.get(violation.rule, 0) + violation.n_rows
    offending = [
        (v.rule, ", ".join(v.files), index, leaf) for v in violations for index, leaf in v.rows
    ][:ROWS_SHOWN]
    return {
        "invalid_rows_per_rule": dg.MetadataValue.json(per_rule),
        "rules": dg.MetadataValue.md(
            markdown_table(
                ["rule", "rows", "message"],
                [(v.rule, v.n_rows, v.message) for v in violations],
            )
        ),
        "first_offending_rows": dg.MetadataValue.md(
            markdown_table(["rule", "file", "index", "leaf"], offending)
        ),
    }


@contextmanager
def failures_reported(context: dg.AssetExecutionContext) -> Iterator[None]:
    """Turn the core's errors into a run failure that carries its summary, not a traceback."""
    try:
        yield
    except StepError as exc:
        rules = sorted({v.rule for v in exc.violations})
        context.instance.add_run_tags(context.run.run_id, {FAILURE_TAG: ", ".join(rules)})
        raise dg.Failure(
            description=str(exc),
            metadata=violation_metadata(exc.violations),
            allow_retries=False,
        ) from exc
    except UsageError as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from exc


def column_schema(frame: pl.DataFrame) -> dg.TableSchema:
    return dg.TableSchema(
        columns=[dg.TableColumn(name, str(dtype)) for name, dtype in frame.schema.items()]
    )


def sample_metadata(samples: SampleTable, folder: Path) -> dict[str, Any]:
    inputs = dg.MetadataValue.table(
        records=[
            dg.TableRecord({"path": i["path"], "rows": i["rows"], "sha256": i["sha256"][:16]})
            for i in samples.inputs
        ],
        schema=dg.TableSchema(
            columns=[
                dg.TableColumn("path", "string"),
                dg.TableColumn("rows", "int"),
                dg.TableColumn("sha256", "string"),
            ]
        ),
    )
    quarantined = samples.quarantine.height if samples.quarantine is not None else 0
    return {
        "dagster/partition_row_count": samples.frame.height,
        "dagster/column_schema": column_schema(samples.frame.drop(PROVENANCE, strict=False)),
        "ingested": samples.ingested,
        "quarantined": quarantined,
        "repaired": dg.MetadataValue.json(samples.repaired),
        "ignored_columns": dg.MetadataValue.json(samples.ignored_columns),
        "inputs": inputs,
        "staged": dg.MetadataValue.path(str(folder)),
    }


def _layout_metadata(meta: dict[str, Any]) -> dict[str, Any]:
    return {
        **meta["counts"],
        "is_compact": meta["is_compact"],
        "global_batch_size": meta["global_batch_size"],
        "dynamic_global_batch_size": meta["dynamic_global_batch_size"],
        "num_train_steps": meta["num_train_steps"],
        "num_rollouts": dg.MetadataValue.json(meta["num_rollouts"]),
    }


def batch_metadata(batch: TrainBatch, folder: Path) -> dict[str, Any]:
    return {
        "dagster/partition_row_count": batch.frame.height,
        "dagster/column_schema": column_schema(batch.frame),
        **_layout_metadata(batch.meta),
        "num_microbatches": dg.MetadataValue.json(batch.meta["num_microbatches"]),
        "equal_reward_groups": batch.meta["equal_reward_groups"],
        "staged": dg.MetadataValue.path(str(folder)),
    }


def _rank_table(outputs: list[dict[str, Any]]) -> dg.MetadataValue:
    records = [
        dg.TableRecord({"file": o["path"], "rows": o["rows"], "tokens": o["tokens"]})
        for o in outputs
        if o["path"] != writer.QUARANTINE
    ]
    return dg.MetadataValue.table(
        records=records,
        schema=dg.TableSchema(
            columns=[
                dg.TableColumn("file", "string"),
                dg.TableColumn("rows", "int"),
                dg.TableColumn("tokens", "int"),
            ]
        ),
    )


def _reward_stats(frame: pl.DataFrame) -> dict[str, float | None]:
    stats = frame.select(
        pl.col(c.REWARDS).mean().alias("reward_mean"),
        pl.col(c.REWARDS).std().alias("reward_std"),
        pl.col(c.REWARDS).min().alias("reward_min"),
        pl.col(c.REWARDS).max().alias("reward_max"),
        pl.col(c.RAW_REWARD).mean().alias("raw_reward_mean"),
    )
    return stats.row(0, named=True)


def shard_metadata(manifest: dict[str, Any], batch: TrainBatch, folder: Path) -> dict[str, Any]:
    """Row count, schema, manifest counts, layout, per-rank table and reward statistics."""
    return {
        "dagster/partition_row_count": manifest["counts"]["written"],
        "dagster/column_schema": column_schema(batch.frame.drop(c.RANK)),
        **_layout_metadata(manifest),
        "ranks": _rank_table(manifest["outputs"]),
        **_reward_stats(batch.frame),
        "path": dg.MetadataValue.path(str(folder)),
    }

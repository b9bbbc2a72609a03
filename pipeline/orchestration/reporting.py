"""What the assets show in the UI: materialization metadata and failure summaries."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import dagster as dg
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.storage.event_log.schema import AssetCheckExecutionsTable
from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage

from pipeline.errors import StepError, UsageError, Violation, error_lines, os_violation
from pipeline.orchestration.partitions import step_of
from pipeline.orchestration.stage_reports import Metadata

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


def forget_unrun_checks(context: dg.AssetExecutionContext) -> int:
    """Drop the check executions this run planned on its partition and never ran; returns
    how many. Dagster plans every selected check when it creates the run, and a planned
    check whose run fails resolves to "execution failed" (the UI's red "Failed"), so one
    refused step would mark each check failed although no shards were published to check:
    the step's failure belongs to the run and the partition, and the partition's checks keep
    what they said of the shards published before, if any. Only the SQL event logs (SQLite,
    Postgres) keep these rows; elsewhere the planned checks stay."""
    storage = context.instance.event_log_storage
    if not isinstance(storage, SqlEventLogStorage) or not context.has_partition_key:
        return 0
    table = AssetCheckExecutionsTable
    with storage.index_connection() as conn:
        removed = conn.execute(
            table.delete().where(
                table.c.run_id == context.run.run_id,
                table.c.partition == context.partition_key,
                table.c.execution_status == AssetCheckExecutionRecordStatus.PLANNED.value,
                table.c.asset_key.in_([key.to_string() for key in context.assets_def.keys]),
            )
        )
    return removed.rowcount or 0


def refusal_observed(
    context: dg.AssetExecutionContext, lines: Sequence[str], violations: Sequence[Violation]
) -> None:
    """Put why a step was refused where its partition's red dot leads: an observation of
    each of the step's assets on the partition, holding the lines the command line prints
    (rule, file, first rows) and the offending rows. A failed run materializes nothing, so
    without it the partition page would say only that the run failed."""
    if not context.has_partition_key:
        return
    metadata: dict[str, Any] = {
        "refused": dg.MetadataValue.md("\n".join(f"- `{_md_cell(line)}`" for line in lines)),
        "run": dg.MetadataValue.text(context.run.run_id),
    }
    if violations:
        metadata |= violation_metadata(violations)
        files = sorted({file for v in violations for file in v.files})
        metadata["files"] = dg.MetadataValue.json(files)
    for key in context.assets_def.keys:
        context.log_event(
            dg.AssetObservation(
                asset_key=key,
                partition=context.partition_key,
                description=lines[0] if lines else None,
                metadata=metadata,
            )
        )


@contextmanager
def failures_reported(context: dg.AssetExecutionContext) -> Iterator[None]:
    """Turn the core's errors into a run failure that carries its summary, not a traceback:
    the description is the lines the command line prints, so the UI shows them first. Each
    of them fails the step before anything is published, so the checks the run planned on
    the partition are dropped (`forget_unrun_checks`): the run and the partition show the
    failure, the checks do not."""
    try:
        yield
    except StepError as exc:
        rules = sorted({v.rule for v in exc.violations})
        context.instance.add_run_tags(context.run.run_id, {FAILURE_TAG: ", ".join(rules)})
        forget_unrun_checks(context)
        refusal_observed(context, error_lines("build", exc), exc.violations)
        # from None: the user's data broke a rule, and the core's traceback says nothing more
        raise dg.Failure(
            description="\n".join(error_lines("build", exc)),
            metadata=violation_metadata(exc.violations),
            allow_retries=False,
        ) from None
    except UsageError as exc:
        forget_unrun_checks(context)
        refusal_observed(context, error_lines("build", exc), [])
        raise dg.Failure(description=error_lines("build", exc)[0], allow_retries=False) from None
    except OSError as exc:  # the machine's fault (disk full, permissions): one line too
        step = step_of(context.partition_key) if context.has_partition_key else None
        error = StepError([os_violation(exc, "the output root", step)])
        forget_unrun_checks(context)
        refusal_observed(context, error_lines("build", error), error.violations)
        raise dg.Failure(description=error_lines("build", error)[0]) from exc


def _table_schema(columns: list[dict[str, str]]) -> dg.TableSchema:
    return dg.TableSchema(
        columns=[
            dg.TableColumn(column["name"], column["type"], description=column.get("description"))
            for column in columns
        ]
    )


def _metadata_value(value: dict[str, Any]) -> dg.MetadataValue:
    kind, raw = value["type"], value["raw_value"]
    if kind == "table":
        return dg.MetadataValue.table(
            records=[dg.TableRecord(record) for record in raw["records"]],
            schema=_table_schema(raw["schema"]),
        )
    if kind == "table_schema":
        return dg.MetadataValue.table_schema(_table_schema(raw["columns"]))
    if kind == "null":
        return dg.MetadataValue.null()
    simple = {
        "bool": dg.MetadataValue.bool,
        "int": dg.MetadataValue.int,
        "float": dg.MetadataValue.float,
        "text": dg.MetadataValue.text,
        "json": dg.MetadataValue.json,
        "md": dg.MetadataValue.md,
        "path": dg.MetadataValue.path,
    }
    return simple[kind](raw)


def dagster_metadata(metadata: Metadata) -> dict[str, dg.MetadataValue]:
    """A stage's metadata (Pipes wire format) as Dagster's values, as Pipes resolves it."""
    return {key: _metadata_value(value) for key, value in metadata.items()}

"""What the assets show in the UI: materialization metadata and failure summaries."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import dagster as dg
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.storage.event_log.schema import AssetCheckExecutionsTable
from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage

from pipeline.errors import StepError, UsageError, Violation, error_lines, os_violation
from pipeline.io.storage import ObjectRoot
from pipeline.orchestration.partitions import step_of
from pipeline.orchestration.stage_reports import Metadata
from pipeline.step import ROLLOUT_SAMPLES, refused

ROWS_SHOWN = 20
FAILURE_TAG = "rollout_shards/invalid"
ROLLOUT_SAMPLES_KEY = dg.AssetKey(ROLLOUT_SAMPLES)


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


STEP_KEEPS_EVERY_RULE = "step_keeps_every_rule"
"""The check the step itself runs on `rollout_samples`: the step keeps every rule of the
contract (its rows', and the settings its data must satisfy). It passes when the step is
published and fails, red on the partition, with the command line's lines and the offending
rows, when the step is refused."""


def refusal_record(
    context: dg.AssetExecutionContext, out_root: Path | ObjectRoot | None
) -> dict[str, Any]:
    """Where the refused step's record is (`step.refused`: what a trainer waiting on the
    step is told of), as metadata; nothing when no record was left."""
    if not isinstance(out_root, Path) or not context.has_partition_key:
        return {}  # none asked for, or an object store, which keeps no refusal records
    record = refused.record_path(out_root, step_of(context.partition_key))
    return {"refused_record": dg.MetadataValue.path(str(record))} if record.is_file() else {}


def refusal_check(
    context: dg.AssetExecutionContext,
    lines: Sequence[str],
    violations: Sequence[Violation],
    extra: dict[str, Any] | None = None,
) -> dg.AssetCheckResult | None:
    """The failed evaluation of `step_keeps_every_rule` on the refused partition, holding the
    lines the command line prints (rule, file, first rows) and the offending rows; None when
    the run did not select the check."""
    key = dg.AssetCheckKey(ROLLOUT_SAMPLES_KEY, STEP_KEEPS_EVERY_RULE)
    if key not in context.selected_asset_check_keys:
        return None
    metadata: dict[str, Any] = {
        "refused": dg.MetadataValue.md("\n".join(f"- `{_md_cell(line)}`" for line in lines)),
    }
    if violations:
        metadata |= violation_metadata(violations)
        metadata["files"] = dg.MetadataValue.json(sorted({f for v in violations for f in v.files}))
    metadata |= extra or {}
    return dg.AssetCheckResult(
        asset_key=ROLLOUT_SAMPLES_KEY,
        check_name=STEP_KEEPS_EVERY_RULE,
        passed=False,
        severity=dg.AssetCheckSeverity.ERROR,
        description="\n".join(lines) or None,
        metadata=metadata,
    )


def rules_followed(context: dg.AssetExecutionContext) -> Iterator[dg.AssetCheckResult]:
    """The passed evaluation of `step_keeps_every_rule`, when the run selected it."""
    key = dg.AssetCheckKey(ROLLOUT_SAMPLES_KEY, STEP_KEEPS_EVERY_RULE)
    if key in context.selected_asset_check_keys:
        yield dg.AssetCheckResult(
            asset_key=ROLLOUT_SAMPLES_KEY, check_name=STEP_KEEPS_EVERY_RULE, passed=True
        )


def _refused(
    context: dg.AssetExecutionContext,
    lines: list[str],
    violations: Sequence[Violation],
    extra: dict[str, Any] | None = None,
) -> Iterator[dg.AssetCheckResult]:
    forget_unrun_checks(context)
    check = refusal_check(context, lines, violations, extra)
    if check is not None:
        yield check


def failures_reported(
    context: dg.AssetExecutionContext,
    events: Iterator[Any],
    out_root: Callable[[], Path | ObjectRoot] | None = None,
) -> Iterator[Any]:
    """`events` (the step's results), with the core's errors turned into a failed
    `step_keeps_every_rule` on the partition and a run failure that carries the summary, not
    a traceback: the description is the lines the command line prints, so the run's log
    shows them first. Each of them fails the step before anything is published, so the
    other checks the run planned on the partition are dropped (`forget_unrun_checks`).
    `out_root` is asked for only once the step was refused: resolving it checks the run
    config's paths, and a bad path must fail inside `events` as the user's one line."""
    try:
        yield from events
    except StepError as exc:
        rules = sorted({v.rule for v in exc.violations})
        context.instance.add_run_tags(context.run.run_id, {FAILURE_TAG: ", ".join(rules)})
        lines = error_lines("build", exc)
        record = refusal_record(context, out_root() if out_root else None)
        yield from _refused(context, lines, exc.violations, record)
        # from None: the user's data broke a rule, and the core's traceback says nothing more
        raise dg.Failure(
            description="\n".join(lines),
            metadata=violation_metadata(exc.violations) | record,
            allow_retries=False,
        ) from None
    except UsageError as exc:
        lines = error_lines("build", exc)
        yield from _refused(context, lines, [])
        raise dg.Failure(description=lines[0], allow_retries=False) from None
    except OSError as exc:  # the machine's fault (disk full, permissions): one line too
        step = step_of(context.partition_key) if context.has_partition_key else None
        error = StepError([os_violation(exc, "the output root", step)])
        lines = error_lines("build", error)
        yield from _refused(context, lines, error.violations)
        raise dg.Failure(description=lines[0]) from exc


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
        "url": dg.MetadataValue.url,
    }
    return simple[kind](raw)


def dagster_metadata(metadata: Metadata) -> dict[str, dg.MetadataValue]:
    """A stage's metadata (Pipes wire format) as Dagster's values, as Pipes resolves it."""
    return {key: _metadata_value(value) for key, value in metadata.items()}

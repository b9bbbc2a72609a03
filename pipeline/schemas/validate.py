"""Run the sample-table models and turn their failure cases into one line per rule."""

from __future__ import annotations

from dataclasses import dataclass

import pandera.polars as pa
import polars as pl
from pandera.config import ValidationDepth, config_context

from pipeline import columns as c
from pipeline.errors import Violation
from pipeline.schemas.samples import RolloutSampleTable, SampleRules, SiblingRewards
from pipeline.transforms import samples as s

MAX_ROWS_SHOWN = 5


@dataclass
class RuleFailure:
    violation: Violation
    positions: pl.Series  # every failing row position in the step's batch order


def _failure_cases(model: type[pa.DataFrameModel], frame: pl.DataFrame) -> pl.DataFrame | None:
    with config_context(validation_depth=ValidationDepth.SCHEMA_AND_DATA):
        try:
            model.validate(frame, lazy=True)
        except pa.errors.SchemaErrors as exc:
            return exc.failure_cases
    return None


def _rollout_reward_message(light: pl.DataFrame, positions: pl.Series) -> str:
    rows = light.filter(pl.col(s.POSITION).is_in(positions.implode()))
    key = rows.get_column(s.ROLLOUT_KEY)[0]
    first = rows.filter(pl.col(s.ROLLOUT_KEY) == key)
    return (
        f"all samples in rollout {key} must share one reward; rows "
        f"{first.get_column(s.POSITION).to_list()} have rewards "
        f"{first.get_column(s.REWARD_VALUE).to_list()}"
    )


def _summarise(
    cases: pl.DataFrame, light: pl.DataFrame, step: int, messages: dict[str, str]
) -> list[RuleFailure]:
    rule = (
        pl.when(pl.col("schema_context") == "Column")
        .then(pl.col("column") + "_" + pl.col("check").str.extract(r"^([^(]*)"))
        .otherwise(pl.col("check"))
    )
    cases = cases.with_columns(rule.str.split(": ").list.first().alias("rule"))
    failures = []
    for (rule,), group in cases.group_by("rule", maintain_order=True):
        positions = group.get_column("index").drop_nulls().cast(pl.Int64).unique().sort()
        rows = light.filter(pl.col(s.POSITION).is_in(positions.implode())).sort(s.POSITION)
        message = messages.get(rule) or group.get_column("check")[0].partition(": ")[2]
        if rule == "rollout_shares_reward":
            message = _rollout_reward_message(light, positions)
        elif rows.height == 0:
            message = f"{message} (got {group.get_column('failure_case').head(3).to_list()})"
        violation = Violation(
            rule=rule,
            message=message,
            step=step,
            files=rows.get_column(c.SOURCE_FILE).unique(maintain_order=True).head(3).to_list(),
            rows=list(
                zip(
                    rows.get_column(c.INDEX).head(MAX_ROWS_SHOWN).to_list(),
                    rows.get_column(c.LEAF).head(MAX_ROWS_SHOWN).to_list(),
                    strict=True,
                )
            ),
            n_rows=rows.height,
        )
        failures.append(RuleFailure(violation, positions))
    return failures


def _column_messages() -> dict[str, str]:
    return {
        "session_version_isin": "session_version must be v1, v2 or null",
        "status_isin": f"status must be one of {', '.join(c.STATUSES)}",
        "leaf_greater_than_or_equal_to": "leaf must be >= 0",
        "response_length_greater_than_or_equal_to": "response_length must be >= 0",
    }


def check_samples(
    frame: pl.DataFrame, light: pl.DataFrame, step: int, sibling_rewards: bool
) -> list[RuleFailure]:
    """Every rule broken by a step's rows; [] when the step is valid."""
    failures: list[RuleFailure] = []
    table_cases = _failure_cases(RolloutSampleTable, frame.drop(c.REWARD))
    if table_cases is not None:
        messages = _column_messages()
        for key in ("not_nullable",):
            for name in frame.columns:
                messages[f"{name}_{key}"] = f"{name} must not be null"
        failures += _summarise(table_cases, light, step, messages)
    models = [SampleRules] + ([SiblingRewards] if sibling_rewards else [])
    for model in models:
        cases = _failure_cases(model, light)
        if cases is not None:
            failures += _summarise(cases, light, step, {})
    return failures

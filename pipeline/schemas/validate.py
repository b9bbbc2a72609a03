"""Run the sample-table models and turn their failure cases into one line per rule.

`validate_step` checks a step in three phases, so that one bad value is reported once
rather than again by every rule it upsets: values that do not fit their contract type
(found while reading), then single-value rules (nullability, allowed values, ranges) on
the rows that typed, then the row and cross-row rules on the trajectories left. In
quarantine mode the last phase repeats on what remains until nothing more fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING

import polars as pl

from pipeline import columns as c
from pipeline.columns import REASON, ROW_ID, TYPE_ERROR
from pipeline.errors import StepError, Violation
from pipeline.transforms import samples as s

if TYPE_CHECKING:
    import pandera.polars as pa
    from pandera.api.polars.types import PolarsData

MAX_ROWS_SHOWN = 5
# Removing invalid trajectories can expose a new failure (the all-or-none rules count
# rows); a few rounds always settle it, the cap only guards against a rule that never does.
MAX_ROUNDS = 4


@dataclass
class RuleFailure:
    violation: Violation
    positions: pl.Series  # every failing row position in the step's batch order
    reason: str = ""  # "rule: message" for each failing row, without row-specific detail


@cache
def load_models() -> ModuleType:
    """The Pandera models. Importing pandera is a good part of a small step's time, so it
    happens on first use, and `ingest.load_samples` does it on a second thread while Polars
    reads the files. Pandera's backends are registered only when a step fails a rule and its
    failure cases are needed (`_failure_cases`)."""
    # The polars versions of Pandera's built-in checks (isin, ge, ...) register on import,
    # and a check built before that cannot run on polars data.
    import pandera.backends.polars.builtin_checks  # noqa: F401

    from pipeline.schemas import samples as models

    for model in (models.RolloutSampleTable, models.SampleRules, models.SiblingRewards):
        _schema(model)
    return models


@cache
def _schema(model: type[pa.DataFrameModel]) -> pa.DataFrameSchema:
    return model.to_schema()


def _check_passed(check: pa.Check, data: PolarsData) -> pl.LazyFrame | None:
    """One row, one boolean: does `check` pass on `data`? Evaluated as Pandera's polars
    backend does (every output column must hold; a null passes only with `ignore_na`).
    None for an element-wise check, which only Pandera runs."""
    if check.element_wise:
        return None
    out = check._check_fn(data, **check._check_kwargs)
    if isinstance(out, bool):
        return pl.LazyFrame({"ok": [out]})
    ok = pl.all_horizontal(pl.all()).fill_null(check.ignore_na)
    result: pl.LazyFrame = out.select(ok.all().alias("ok"))
    return result


def _column_tests(schema: pa.DataFrameSchema, frame: pl.DataFrame) -> list[pl.LazyFrame] | None:
    """The tests of every column of `schema`: presence and dtype (decided here), nulls and
    its checks (as lazy one-row frames). None where Pandera would do something more."""
    from pandera.api.polars.types import PolarsData

    tests: list[pl.LazyFrame] = []
    lazy = frame.lazy()
    for name, column in schema.columns.items():
        if column.regex or column.unique or column.coerce or column.drop_invalid_rows:
            return None
        if name not in frame.schema:
            if column.required:
                return None
            continue
        if column.dtype is not None and column.dtype.type != frame.schema[name]:
            return None
        if not column.nullable:
            missing = pl.col(name).is_null()
            if frame.schema[name].is_float():
                missing = missing | pl.col(name).is_nan()
            tests.append(lazy.select((~missing).all().alias("ok")))
        for check in column.checks:
            test = _check_passed(check, PolarsData(lazy, name))
            if test is None:
                return None
            tests.append(test)
    return tests


def passes(model: type[pa.DataFrameModel], frame: pl.DataFrame) -> bool | None:
    """True when `frame` passes every column and dataframe check of `model`, found by one
    Polars query over all the checks' expressions instead of Pandera's query per check.
    False when some check fails; None when the model uses a feature this does not
    evaluate (then only Pandera's own validation decides). New checks of the models join
    by themselves: they are read from the schema, not listed here."""
    from pandera.api.polars.types import PolarsData

    load_models()
    schema = _schema(model)
    if schema.unique or schema.coerce or schema.ordered or schema.drop_invalid_rows:
        return None
    if schema.strict or schema.add_missing_columns:
        return None
    tests = _column_tests(schema, frame)
    if tests is None:
        return None
    for check in schema.checks:
        test = _check_passed(check, PolarsData(frame.lazy(), "*"))
        if test is None:
            return None
        tests.append(test)
    if not tests:
        return True
    combined = pl.concat(
        [test.select(pl.col("ok").alias(f"ok_{i}")) for i, test in enumerate(tests)],
        how="horizontal",
    )
    try:
        with pl.Config(engine_affinity="in-memory"):
            row = combined.collect().row(0)
    except pl.exceptions.PolarsError:
        return None
    return all(value is True for value in row)


def _failure_cases(model: type[pa.DataFrameModel], frame: pl.DataFrame) -> pl.DataFrame | None:
    """Pandera's failure cases of `frame`, or None when it passes. A frame that `passes`
    never reaches Pandera's validation; any other gets Pandera's own report, so the
    failures and messages are Pandera's."""
    if passes(model, frame):
        return None
    from pandera.config import ValidationDepth, config_context
    from pandera.errors import SchemaErrors

    _schema(model).get_backend(check_type=pl.DataFrame)

    # Pandera runs one small query per check: Polars' in-memory engine starts each one
    # faster than the streaming engine that Polars 2 picks by default.
    with (
        config_context(validation_depth=ValidationDepth.SCHEMA_AND_DATA),
        pl.Config(engine_affinity="in-memory"),
    ):
        try:
            model.validate(frame, lazy=True)
        except SchemaErrors as exc:
            cases: pl.DataFrame = exc.failure_cases
            return cases
    return None


def _rollout_reward_message(light: pl.DataFrame, positions: pl.Series) -> str:
    rows = light.filter(pl.col(c.POSITION).is_in(positions.implode()))
    key = rows.get_column(c.ROLLOUT_KEY)[0]
    first = rows.filter(pl.col(c.ROLLOUT_KEY) == key)
    return (
        f"all samples in rollout {key} must share one reward; rows "
        f"{first.get_column(c.POSITION).to_list()} have rewards "
        f"{first.get_column(c.REWARD_VALUE).to_list()}"
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
        rows = light.filter(pl.col(c.POSITION).is_in(positions.implode())).sort(c.POSITION)
        message = messages.get(rule) or group.get_column("check")[0].partition(": ")[2]
        reason = f"{rule}: {message}"
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
        failures.append(RuleFailure(violation, positions, reason))
    return failures


def _column_messages() -> dict[str, str]:
    return {
        "session_version_isin": "session_version must be v1, v2 or null",
        "status_isin": f"status must be one of {', '.join(c.STATUSES)}",
        "leaf_greater_than_or_equal_to": "leaf must be >= 0",
        "response_length_greater_than_or_equal_to": "response_length must be >= 0",
    }


def check_columns(frame: pl.DataFrame, light: pl.DataFrame, step: int) -> list[RuleFailure]:
    """Rules of single values (nullability, allowed values, ranges) of a step's rows."""
    table_cases = _failure_cases(load_models().RolloutSampleTable, frame.drop(c.REWARD))
    if table_cases is None:
        return []
    messages = _column_messages()
    for name in frame.columns:
        messages[f"{name}_not_nullable"] = f"{name} must not be null"
    return _summarise(table_cases, light, step, messages)


def check_rules(light: pl.DataFrame, step: int, sibling_rewards: bool) -> list[RuleFailure]:
    """Row invariants and the rules across rows (rollout ids, sibling rewards)."""
    failures: list[RuleFailure] = []
    models = load_models()
    for model in [models.SampleRules] + ([models.SiblingRewards] if sibling_rewards else []):
        cases = _failure_cases(model, light)
        if cases is not None:
            failures += _summarise(cases, light, step, {})
    return failures


@dataclass
class Verdict:
    """What validation found in a step."""

    valid: pl.DataFrame  # the rows outside every trajectory holding a failing row
    violations: list[Violation]  # one per broken rule
    failing: pl.DataFrame  # ROW_ID, REASON: one row per failing row and rule
    settled: bool  # every violation names rows, so setting them aside leaves a valid step


def without_trajectories(frame: pl.DataFrame, row_ids: pl.Series) -> pl.DataFrame:
    """The rows of every trajectory that holds none of `row_ids`."""
    touched = pl.col(ROW_ID).is_in(row_ids.implode()).any().over(c.TRAJECTORY)
    return frame.filter(~touched)


def _failing_rows(frame: pl.DataFrame, failures: list[RuleFailure]) -> pl.DataFrame:
    ids = frame.get_column(ROW_ID)
    return pl.concat(
        [
            ids.gather(f.positions).to_frame(ROW_ID).with_columns(pl.lit(f.reason).alias(REASON))
            for f in failures
        ],
        how="vertical_relaxed",
    )


def validate_step(
    frame: pl.DataFrame,
    type_violations: list[Violation],
    step: int,
    reward_key: str | None,
    sibling_rewards: bool,
    until_valid: bool,
) -> Verdict:
    """Check a loaded step (with ROW_ID and TYPE_ERROR columns). With `until_valid`, keep
    setting failing trajectories aside until the rest passes every rule."""

    def light(rows: pl.DataFrame) -> pl.DataFrame:
        try:
            return s.light_columns(rows.lazy(), reward_key, step).collect()
        except StepError as error:
            files = rows.get_column(c.SOURCE_FILE).unique(maintain_order=True).head(3)
            for violation in error.violations:
                violation.files = violation.files or files.to_list()
            raise

    violations = list(type_violations)
    typed_bad = frame.filter(pl.col(TYPE_ERROR).is_not_null())
    failing = [typed_bad.select(ROW_ID, pl.col(TYPE_ERROR).alias(REASON))]
    typed = frame.filter(pl.col(TYPE_ERROR).is_null())
    failures = check_columns(typed, light(typed), step)
    settled = all(f.positions.len() for f in failures)
    if failures:
        violations += [f.violation for f in failures]
        failing.append(_failing_rows(typed, failures))
    valid = without_trajectories(frame, pl.concat([f.get_column(ROW_ID) for f in failing]))
    for _ in range(MAX_ROUNDS):
        failures = check_rules(light(valid), step, sibling_rewards)
        if not failures:
            break
        settled = settled and all(f.positions.len() for f in failures)
        violations += [f.violation for f in failures]
        rows = _failing_rows(valid, failures)
        failing.append(rows)
        valid = without_trajectories(valid, rows.get_column(ROW_ID))
        if not until_valid:
            break
    else:
        settled = False
    return Verdict(
        valid=valid,
        violations=violations,
        failing=pl.concat(failing, how="vertical_relaxed"),
        settled=settled,
    )

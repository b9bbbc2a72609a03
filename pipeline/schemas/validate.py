"""Run the sample-table models and turn their failure cases into one line per rule.

`validate_step` checks a step in three phases, so that one bad value is reported once
rather than again by every rule it upsets: values that do not fit their contract type
(found while reading), then single-value rules (nullability, allowed values, ranges) on
the rows that typed, then the row and cross-row rules on the trajectories left. In
quarantine mode the last phase repeats on what remains until nothing more fails.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

from pipeline import columns as c
from pipeline.columns import REASON, ROW_ID, TYPE_ERROR
from pipeline.errors import StepError, Violation
from pipeline.schemas.rules import ROWS, SIBLINGS, TABLE, Model
from pipeline.transforms import samples as s
from pipeline.transforms.repair import repairable

MAX_ROWS_SHOWN = 5
# Legacy data written before miles PR #2536 breaks these; the repair policy fixes it,
# and the line says so when repair would fix every row it names.
ROLLOUT_ID_RULES = ("rollout_id_only_on_v2_multi_leaf",)
REPAIR_HINT = (
    "for data written before this rule, --rollout-id-policy repair clears the ids of v1 rows "
    "and single-row trajectories and gives v2 leaves without one a sibling's id, else their "
    "index"
)
# A step whose every broken rule names rows builds the rest when those are set aside.
QUARANTINE_HINT = "--on-invalid quarantine would set these trajectories aside and build the rest"
# The values a row rule reads, named on the first failing row: (light column, name shown).
RULE_VALUES: dict[str, tuple[tuple[str, str], ...]] = {
    "reward_finite": ((c.REWARD_VALUE, "reward"),),
    "raw_reward_finite": ((c.RAW_REWARD, "raw_reward"),),
    "response_within_tokens": ((c.RESPONSE_LENGTH, "response_length"), (c.N_TOKENS, "tokens")),
    "loss_mask_length": ((c.MASK_LEN, "loss_mask length"), (c.RESPONSE_LENGTH, "response_length")),
    "rollout_log_probs_length": (
        (c.RLP_LEN, "rollout_log_probs length"),
        (c.RESPONSE_LENGTH, "response_length"),
    ),
    "teacher_log_probs_length": (
        (c.TLP_LEN, "teacher_log_probs length"),
        (c.RESPONSE_LENGTH, "response_length"),
    ),
    "rollout_id_only_on_v2_multi_leaf": (
        (c.ROLLOUT_ID, "rollout_id"),
        (c.SESSION_VERSION, "session_version"),
        (c.TRAJECTORY_SIZE, "leaves"),
    ),
    "rollout_id_shared_by_siblings": ((c.ROLLOUT_ID, "rollout_id"),),
    "rollout_id_on_multi_leaf": ((c.ROLLOUT_ID, "rollout_id"), (c.TRAJECTORY_SIZE, "leaves")),
    "one_session_version": ((c.SESSION_VERSION, "session_version"),),
    "rollout_key_unique_per_trajectory": ((c.ROLLOUT_KEY, "rollout key"),),
    "multi_leaf_only_in_v2": ((c.SESSION_VERSION, "session_version"), (c.TRAJECTORY_SIZE, "rows")),
}
REPAIRABLE = repairable(
    pl.col(c.SESSION_VERSION), pl.col(c.TRAJECTORY_SIZE) > 1, pl.col(c.ROLLOUT_ID)
)
# Removing invalid trajectories can expose a new failure (the all-or-none rules count
# rows); a few rounds always settle it, the cap only guards against a rule that never does.
MAX_ROUNDS = 4


@dataclass
class RuleFailure:
    violation: Violation
    positions: pl.Series  # every failing row position in the step's batch order
    reason: str = ""  # "rule: message" for each failing row, without row-specific detail


def _column_tests(model: Model, schema: pl.Schema) -> list[pl.Expr] | None:
    """One boolean expression per column test of `model` (nulls, allowed values, lower
    bounds), as Pandera's polars backend evaluates them; None when a column is missing or
    of another type (then Pandera reports it)."""
    tests: list[pl.Expr] = []
    for name, rule in model.columns.items():
        if name not in schema:
            if rule.required:
                return None
            continue
        if schema[name] != rule.dtype:
            return None
        value = pl.col(name)
        if not rule.nullable:
            missing = value.is_null()
            if schema[name].is_float():
                missing = missing | value.is_nan()
            tests.append(~missing)
        if rule.isin is not None:
            tests.append(value.is_in(list(rule.isin)).fill_null(True))
        if rule.ge is not None:
            tests.append((value >= rule.ge).fill_null(True))
    return tests


def passes(model: Model, frame: pl.DataFrame) -> bool | None:
    """True when `frame` passes every column test and rule of `model`, found by one Polars
    query over the rules' expressions, without Pandera. False when some test fails; None
    when the query cannot run (then Pandera's own validation decides)."""
    tests = _column_tests(model, frame.schema)
    if tests is None:
        return False
    tests += [rule.ok() for rule in model.rules]
    if not tests:
        return True
    query = frame.lazy().select(test.all().alias(f"ok_{i}") for i, test in enumerate(tests))
    try:
        with pl.Config(engine_affinity="in-memory"):
            row = query.collect().row(0)
    except pl.exceptions.PolarsError:
        return None
    return all(value is True for value in row)


def _failure_cases(model: Model, frame: pl.DataFrame) -> pl.DataFrame | None:
    """Pandera's failure cases of `frame`, or None when it passes. A frame that `passes`
    never reaches Pandera; any other gets Pandera's own report, so the failures and
    messages are Pandera's."""
    if passes(model, frame):
        return None
    # Pandera (and pandas, which it imports) are most of a small step's fixed cost: only a
    # step that breaks a rule loads them.
    from pandera.config import ValidationDepth, config_context
    from pandera.errors import SchemaErrors

    from pipeline.schemas.samples import schema_of

    # Pandera runs one small query per check: Polars' in-memory engine starts each one
    # with less overhead than the streaming engine that Polars 2 picks by default.
    with (
        config_context(validation_depth=ValidationDepth.SCHEMA_AND_DATA),
        pl.Config(engine_affinity="in-memory"),
    ):
        try:
            schema_of(model).validate(frame, lazy=True)
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


def _shown(value: object) -> str:
    """A value as the line shows it: NaN and infinities by name, null as null."""
    if value is None:
        return "null"
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return str(value)


def _first_row(rows: pl.DataFrame, rule: str, group: pl.DataFrame) -> str:
    """Where the first failing row sits in its file (1-based, as the file stores it) and
    the values the rule read there: `; file row 3 has reward NaN`."""
    if rows.height == 0 or c.SOURCE_ROW not in rows.columns:
        return ""
    first = rows.row(0, named=True)
    if first[c.SOURCE_ROW] is None:
        return ""
    where = f"file row {first[c.SOURCE_ROW] + 1}"
    if rows.get_column(c.SOURCE_FILE).n_unique() > 1:
        where += f" of {first[c.SOURCE_FILE]}"
    named = [(name, label) for name, label in RULE_VALUES.get(rule, ()) if name in rows.columns]
    if named:
        held = ", ".join(f"{label} {_shown(first[name])}" for name, label in named)
    elif group.get_column("schema_context")[0] == "Column":
        case = group.filter(pl.col("index") == first[c.POSITION]).get_column("failure_case")
        held = f"{group.get_column('column')[0]} {_shown(case[0])}" if case.len() else ""
    else:
        return f"; first at {where}"
    return f"; {where} has {held}" if held else f"; first at {where}"


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
        at = _first_row(rows, rule, group)
        if rule == "rollout_shares_reward":
            message = _rollout_reward_message(light, positions)
        elif rule == "step_matches_path":
            held = rows.get_column(c.STEP).unique(maintain_order=True).head(3).to_list()
            message = f"{message}: the step column holds {held}, the path says step {step}{at}"
        elif rule in ROLLOUT_ID_RULES and rows.height and rows.select(REPAIRABLE.all()).item():
            message = f"{message}{at}; {REPAIR_HINT}"
        elif rows.height == 0:
            message = f"{message} (got {group.get_column('failure_case').head(3).to_list()})"
        else:
            message += at
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


def check_columns(
    frame: pl.DataFrame, light: pl.DataFrame, step: int, table: Model = TABLE
) -> list[RuleFailure]:
    """Rules of single values (nullability, allowed values, ranges) of a step's rows (of
    the columns `table` tests: a frame whose lists were tested apart takes TABLE_ROWS)."""
    table_cases = _failure_cases(table, frame.drop(c.REWARD))
    if table_cases is None:
        return []
    messages = _column_messages()
    for name in frame.columns:
        messages[f"{name}_not_nullable"] = f"{name} must not be null"
    return _summarise(table_cases, light, step, messages)


def check_rules(
    light: pl.DataFrame, step: int, sibling_rewards: bool, rows: Model = ROWS
) -> list[RuleFailure]:
    """Row invariants and the rules across rows (rollout ids, sibling rewards); `rows`: the
    trainer's row rules."""
    failures: list[RuleFailure] = []
    for model in [rows] + ([SIBLINGS] if sibling_rewards else []):
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
    light: pl.DataFrame | None = None  # the light columns of `valid`, when computed


def without_trajectories(frame: pl.DataFrame, row_ids: pl.Series) -> pl.DataFrame:
    """The rows of every trajectory that holds none of `row_ids`."""
    if row_ids.is_empty():  # a valid step: no window over its trajectories, no copy
        return frame
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
    table: Model = TABLE,
    row_rules: Model = ROWS,
) -> Verdict:
    """Check a loaded step (with ROW_ID and TYPE_ERROR columns). With `until_valid`, keep
    setting failing trajectories aside until the rest passes every rule."""

    def light(rows: pl.DataFrame) -> pl.DataFrame:
        try:
            return s.light_frame(rows, reward_key, step)
        except StepError as error:
            files = rows.get_column(c.SOURCE_FILE).unique(maintain_order=True).head(3)
            for violation in error.violations:
                violation.files = violation.files or files.to_list()
            raise

    violations = list(type_violations)
    typed_bad = frame.filter(pl.col(TYPE_ERROR).is_not_null())
    failing = [typed_bad.select(ROW_ID, pl.col(TYPE_ERROR).alias(REASON))]
    typed = frame.filter(pl.col(TYPE_ERROR).is_null()) if typed_bad.height else frame
    typed_light = light(typed)
    failures = check_columns(typed, typed_light, step, table)
    settled = all(f.positions.len() for f in failures)
    if failures:
        violations += [f.violation for f in failures]
        failing.append(_failing_rows(typed, failures))
    valid = without_trajectories(frame, pl.concat([f.get_column(ROW_ID) for f in failing]))
    for _ in range(MAX_ROUNDS):
        # the light columns of the typed rows serve again while no row was set aside
        valid_light = typed_light if valid is typed else light(valid)
        failures = check_rules(valid_light, step, sibling_rewards, row_rules)
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
    # the rules' lines (the reader's type lines stay as the reader words them)
    ruled = violations[len(type_violations) :]
    if settled and not until_valid and ruled and all(v.rows for v in violations):
        for violation in ruled:
            violation.message += f"; {QUARANTINE_HINT}"
    return Verdict(
        valid=valid,
        violations=violations,
        failing=pl.concat(failing, how="vertical_relaxed"),
        settled=settled,
        light=None if failures else valid_light,
    )

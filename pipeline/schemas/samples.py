"""The Pandera schemas of a rollout sample table, built from the models of
`pipeline.schemas.rules`: Pandera validates with them and reports the failure cases of a
step that breaks a rule. Imported only then (see `validate._failure_cases`)."""

from __future__ import annotations

import pandera.polars as pa
import polars as pl

# The polars versions of Pandera's built-in checks (isin, ge, ...) register on import, and
# a check built before that cannot run on polars data.
import pandera.backends.polars.builtin_checks  # noqa: F401  # isort: skip
from pandera.api.polars.types import PolarsData

from pipeline.schemas.rules import ColumnRule, Model, Rule


def _column(rule: ColumnRule) -> pa.Column:
    checks = []
    if rule.isin is not None:
        checks.append(pa.Check.isin(list(rule.isin)))
    if rule.ge is not None:
        checks.append(pa.Check.ge(rule.ge))
    return pa.Column(rule.dtype, nullable=rule.nullable, required=rule.required, checks=checks)


def _frame_check(rule: Rule) -> pa.Check:
    def check(data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(rule.ok().alias("ok"))

    return pa.Check(check, name=rule.name, error=rule.error)


def schema(model: Model) -> pa.DataFrameSchema:
    return pa.DataFrameSchema(
        {name: _column(rule) for name, rule in model.columns.items()},
        checks=[_frame_check(rule) for rule in model.rules],
        name=model.name,
        strict=False,
    )


# Built once per model on first use: the core's models and any a trainer declares
# (`Profile.row_rules`), by their names.
_SCHEMAS: dict[str, pa.DataFrameSchema] = {}


def schema_of(model: Model) -> pa.DataFrameSchema:
    """The Pandera schema of `model`, built on first use."""
    if model.name not in _SCHEMAS:
        _SCHEMAS[model.name] = schema(model)
    return _SCHEMAS[model.name]

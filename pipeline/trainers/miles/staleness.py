"""miles' weight-staleness budget, offline (`--max-weight-staleness`, SEMANTICS 3.2).

In fully-async training miles' data buffer (`miles/rollout/fully_async_data_buffer.py`)
drops a finished prompt group when the engine's weight version, at the time training takes
the group, lags the group's oldest weight version by more than the budget. Offline the
engine's version is the step N (miles' version when rollout N is requested with
`--update-weights-interval 1`). A group is the step's rows sharing `group_index`, every leaf
of a trajectory included; a row's versions are the entries of `weight_versions`, or the
versions of its `weight_version_spans` over every call (`all_weight_version_spans`), made of
digits only (`Sample.oldest_weight_version`), its oldest their minimum, the group's oldest
the minimum over its rows. A group without a numeric version is kept; a group with
N - oldest > budget is set aside whole. Polars only: one pass over the step's rows.
"""

from __future__ import annotations

import polars as pl

from pipeline import columns as c
from pipeline.columns import REASON, ROW_ID
from pipeline.errors import StepError, Violation
from pipeline.transforms.weight_versions import version_strings, versions_fit_int64

RULE = "max_weight_staleness"
# miles' own name for the count (`DefaultDataBuffer.get_metrics`), and ours for the rows.
STALE_GROUPS = "rollout/fully_async/stale_groups_filtered"
STALE_ROWS = "rollout/fully_async/stale_rows_filtered"
_OLDEST = "_oldest_weight_version"
_GROUP_OLDEST = "_group_oldest_weight_version"
ROWS_NAMED = 10


def _refused(frame: pl.DataFrame, mask: pl.Series, rule: str, message: str, step: int) -> None:
    if not mask.any():
        return
    shown = frame.filter(mask).head(ROWS_NAMED)
    indexes, leaves = shown.get_column(c.INDEX).to_list(), shown.get_column(c.LEAF).to_list()
    rows = list(zip(indexes, leaves, strict=True))
    raise StepError([Violation(rule, message, step=step, rows=rows, n_rows=int(mask.sum()))])


def _check(frame: pl.DataFrame, versions: pl.Expr, step: int) -> None:
    """Refuse what the budget cannot be measured on as miles measures it."""
    _refused(
        frame,
        frame.get_column(c.GROUP_INDEX).is_null(),
        "staleness_needs_group_index",
        "max_weight_staleness sets prompt groups aside, and these rows have no group_index: "
        "give every row its group_index, or drop max_weight_staleness",
        step,
    )
    non_ascii = versions.list.eval(pl.element().str.contains(r"[^\x00-\x7f]"))
    _refused(
        frame,
        frame.select(non_ascii.list.any().fill_null(False)).to_series(),
        "weight_version_not_ascii",
        "max_weight_staleness reads weight versions as miles does (Python's str.isdigit, "
        "which takes other scripts' digits too): write these weight_versions in ASCII",
        step,
    )


def stale_rows(frame: pl.DataFrame, step: int, budget: int) -> pl.DataFrame:
    """ROW_ID and REASON of every row of the groups the budget sets aside, in batch order.
    `frame`: the step's valid rows with ROW_ID, `group_index` and either form of the
    weight versions."""
    empty = pl.DataFrame(schema={ROW_ID: pl.Int64, REASON: pl.String})
    versions = version_strings(frame.schema)
    if versions is None or frame.is_empty():
        return empty
    if c.GROUP_INDEX not in frame.columns:
        frame = frame.with_columns(pl.lit(None, dtype=pl.Int64).alias(c.GROUP_INDEX))
    _check(frame, versions, step)
    versions_fit_int64(frame, step)
    element = pl.element()
    numeric = pl.when(element.str.contains(r"^[0-9]+$")).then(element.str.to_integer(strict=False))
    oldest = versions.list.eval(numeric).list.min()
    lag = pl.lit(step, dtype=pl.Int64) - pl.col(_GROUP_OLDEST)
    return (
        frame.select(ROW_ID, c.GROUP_INDEX, oldest.alias(_OLDEST))
        .with_columns(pl.col(_OLDEST).min().over(c.GROUP_INDEX).alias(_GROUP_OLDEST))
        .filter((lag > budget).fill_null(False))
        .select(
            ROW_ID,
            pl.format(
                "{}: prompt group {} is {} weight versions stale (step {}, oldest weight "
                "version {}), more than max_weight_staleness={}",
                pl.lit(RULE),
                pl.col(c.GROUP_INDEX),
                lag,
                pl.lit(step),
                pl.col(_GROUP_OLDEST),
                pl.lit(budget),
            ).alias(REASON),
        )
    )


def set_aside_metrics(quarantine: pl.DataFrame | None, group_column: str) -> dict[str, float]:
    """How many groups and rows of a step's quarantine table the budget set aside."""
    if quarantine is None or REASON not in quarantine.columns:
        return {STALE_GROUPS: 0.0, STALE_ROWS: 0.0}
    stale = quarantine.filter(pl.col(REASON).str.starts_with(RULE + ":"))
    groups = stale.get_column(group_column).n_unique() if group_column in stale.columns else 0
    return {STALE_GROUPS: float(groups), STALE_ROWS: float(stale.height)}

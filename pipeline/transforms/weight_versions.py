"""Weight versions every trainer's metrics read (`weight_versions`, SEMANTICS 3.2).

A step holds them in one of two forms: `weight_versions`, one version string per
generation call (miles before its PR #1891), or `weight_version_spans`, per call a list of
`{version, abs_start, abs_end}` spans (miles since). The budget and the metrics read the
versions in call order either way (`version_strings`), as miles' `all_weight_version_spans`
flattens the spans.
"""

from __future__ import annotations

import polars as pl

from pipeline import columns as c
from pipeline.errors import StepError, Violation

ROWS_NAMED = 10

_CALL = pl.element()


def _spans(name: str = c.WEIGHT_VERSION_SPANS) -> pl.Expr:
    """A row's spans of every call, in call order (miles' `all_weight_version_spans`);
    empty and null calls contribute none."""
    return pl.col(name).list.eval(_CALL.filter(_CALL.list.len() > 0).explode())


def version_strings(schema: pl.Schema) -> pl.Expr | None:
    """Each row's weight versions in call order, as a list of strings, from whichever
    form the step holds (spans win when a frame has both: the check refuses such steps);
    None when it holds neither."""
    if c.WEIGHT_VERSION_SPANS in schema:
        return _spans().list.eval(_CALL.struct.field(c.SPAN_VERSION))
    if c.WEIGHT_VERSIONS in schema:
        return pl.col(c.WEIGHT_VERSIONS)
    return None


def spans_valid(schema: pl.Schema) -> pl.Expr:
    """miles' `Sample.validate` of the spans: each version a non-empty string, and over
    the spans of every call in order `previous_end <= abs_start < abs_end <= len(tokens)`
    (previous_end from 0); no call null. Null where a row has no spans."""
    if c.WEIGHT_VERSION_SPANS not in schema:
        return pl.lit(None, dtype=pl.Boolean)
    start, end = _CALL.struct.field(c.SPAN_START), _CALL.struct.field(c.SPAN_END)
    named = _CALL.struct.field(c.SPAN_VERSION).str.len_bytes() > 0
    ordered = (start >= end.shift(1).fill_null(0)) & (start < end)
    spans = _spans()
    each = spans.list.eval((named & ordered).fill_null(False)).list.all()
    within = (spans.list.eval(end).list.max() <= pl.col(c.TOKENS).list.len()).fill_null(True)
    no_null_call = ~pl.col(c.WEIGHT_VERSION_SPANS).list.eval(_CALL.is_null()).list.any()
    return each & within & no_null_call


def holds(schema: pl.Schema, name: str) -> pl.Expr:
    """Whether a row holds weight versions in the form `name` (a non-empty list)."""
    if name not in schema:
        return pl.lit(False)
    return (pl.col(name).list.len() > 0).fill_null(False)


def versions_fit_int64(frame: pl.DataFrame, step: int) -> None:
    """Refuse rows holding a weight version of digits beyond int64: miles reads it as a
    Python integer (`Sample.oldest_weight_version`), which no column type here holds, so
    neither the budget nor the weight_version metrics could measure it as miles does."""
    versions = version_strings(frame.schema)
    if versions is None:
        return
    digits = pl.element().str.contains(r"^[0-9]+$")
    beyond = digits & pl.element().str.to_integer(strict=False).is_null()
    mask = versions.list.eval(beyond).list.any().fill_null(False)
    beyond_int64 = frame.select(mask).to_series()
    if not beyond_int64.any():
        return
    shown = frame.filter(beyond_int64).head(ROWS_NAMED)
    rows = list(
        zip(shown.get_column(c.INDEX).to_list(), shown.get_column(c.LEAF).to_list(), strict=True)
    )
    message = (
        "weight_versions holds a version of digits beyond int64 (9223372036854775807), "
        "which miles reads as a number: write the engine's weight version"
    )
    raise StepError(
        [
            Violation(
                "weight_version_beyond_int64",
                message,
                step=step,
                rows=rows,
                n_rows=int(beyond_int64.sum()),
            )
        ]
    )

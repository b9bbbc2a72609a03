"""Weight versions every trainer's metrics read (`weight_versions`, SEMANTICS 3.2)."""

from __future__ import annotations

import polars as pl

from pipeline import columns as c
from pipeline.errors import StepError, Violation

ROWS_NAMED = 10


def versions_fit_int64(frame: pl.DataFrame, step: int) -> None:
    """Refuse rows holding a weight version of digits beyond int64: miles reads it as a
    Python integer (`Sample.oldest_weight_version`), which no column type here holds, so
    neither the budget nor the weight_version metrics could measure it as miles does."""
    if c.WEIGHT_VERSIONS not in frame.columns:
        return
    digits = pl.element().str.contains(r"^[0-9]+$")
    beyond = digits & pl.element().str.to_integer(strict=False).is_null()
    mask = pl.col(c.WEIGHT_VERSIONS).list.eval(beyond).list.any().fill_null(False)
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

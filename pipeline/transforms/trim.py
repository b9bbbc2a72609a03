"""Compact detection (SEMANTICS section 3): the trainers' trims start from it."""

from __future__ import annotations

import polars as pl

from pipeline import columns as c


def is_compact(light: pl.LazyFrame) -> bool:
    """A batch is compact when any row carries a rollout id."""
    return bool(light.select(pl.col(c.ROLLOUT_ID).is_not_null().any()).collect().item())

"""Compact detection, the global batch size and the trim (SEMANTICS section 3)."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from pipeline import columns as c
from pipeline.errors import step_error
from pipeline.settings import Settings


@dataclass(frozen=True)
class TrimPlan:
    global_batch_size: int
    dynamic_global_batch_size: int | None
    kept: int  # rows kept from the head of the batch
    trimmed: int


def is_compact(light: pl.LazyFrame) -> bool:
    """A batch is compact when any row carries a rollout id."""
    return bool(light.select(pl.col(c.ROLLOUT_ID).is_not_null().any()).collect().item())


def dynamic_global_batch_size(n_rows: int, dp_size: int) -> int:
    """One optimizer step per rollout step: the largest multiple of dp_size, at least dp_size."""
    return max(n_rows // dp_size * dp_size, dp_size)


def plan_trim(n_rows: int, settings: Settings, compact: bool, step: int) -> TrimPlan:
    """How many leading rows form whole optimizer batches; refuse what cannot train."""
    dynamic = None
    size = settings.global_batch_size
    if settings.use_dynamic_global_batch_size:
        if compact:
            raise step_error(
                "dynamic_global_batch_size_on_compact",
                "use_dynamic_global_batch_size cannot apply to a compact batch (v2 multi-leaf "
                "rollout ids present): turn it off or drop the rollout ids",
                step,
            )
        dynamic = size = dynamic_global_batch_size(n_rows, settings.dp_size)
    if compact or settings.disable_rollout_trim_samples:
        return TrimPlan(size, dynamic, n_rows, 0)
    kept = n_rows // size * size
    if kept == 0:
        raise step_error(
            "not_enough_samples",
            f"not enough samples {n_rows} for global_batch_size {size}",
            step,
        )
    return TrimPlan(size, dynamic, kept, n_rows - kept)

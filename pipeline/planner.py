"""How a step loads each rank under a layout, before any GPU: the `plan` command's figures.

The figures come from the same plan a build writes (`step.plan.plan_batch`): each rank's
rows as its rank file would hold them. Per rank, over all its rows (trained or not):
`tokens` (sum of total lengths), `sum_squared_lengths` (the attention cost torchtitan and
TRL balance by), `flops` (the trainer's forward FLOPs estimate, where the model's shape is
given). Over its trained rows: `micro_batches` (null without a micro-batch schedule),
`padding` (tokens a padded micro-batch adds: each micro-batch's longest row times its rows,
less its tokens; per train step without a schedule), `train_steps`. And `untrained`, the rows
the trainer never trains. Each measure's imbalance is its largest rank over the mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import polars as pl

from pipeline import columns as c
from pipeline import trainers
from pipeline.step.tables import TrainBatch

TOKENS = "tokens"
SQUARED = "sum_squared_lengths"
FLOPS = "flops"
MICRO_BATCHES = "micro_batches"
PADDING = "padding"
TRAIN_STEPS = "train_steps"
UNTRAINED = "untrained"
# The measures a layout is chosen by: each one's imbalance, lowest best.
MEASURES = (TOKENS, SQUARED, FLOPS, MICRO_BATCHES, PADDING)
FIGURES = (*MEASURES, TRAIN_STEPS, UNTRAINED)
_ROW_FLOPS = "_row_flops"


@dataclass(frozen=True)
class LayoutPlan:
    """One step under one layout: per-rank figures, or the line saying why it cannot be."""

    step: int
    layout: dict[str, Any]  # the settings that vary across the grid
    ranks: pl.DataFrame | None  # a row per rank, FIGURES columns
    refused: str | None = None

    def imbalance(self) -> dict[str, float | None]:
        return imbalance(self.ranks) if self.ranks is not None else dict.fromkeys(MEASURES)

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "layout": self.layout,
            "ranks": self.ranks.drop(c.RANK).to_dicts() if self.ranks is not None else None,
            "imbalance": self.imbalance(),
            "refused": self.refused,
        }


def rank_figures(batch: TrainBatch, settings: Any) -> pl.DataFrame:
    """The FIGURES of every rank `0 .. dp_size - 1` of a planned step (ranks without rows
    count zeros)."""
    # the planned scalars, without gathering the lists
    planned = batch.rank_rows.scalars if batch.rank_rows is not None else batch.frame
    rows = planned.select(c.RANK, c.TOTAL_LENGTHS, c.TRAIN_STEP, c.MICRO_BATCH)
    lengths = rows.get_column(c.TOTAL_LENGTHS).cast(pl.Int64).to_numpy()
    flops = trainers.profile(settings.trainer).row_flops(lengths, settings)
    rows = rows.with_columns(
        pl.Series(_ROW_FLOPS, flops, dtype=pl.Float64)
        if flops is not None
        else pl.lit(None, dtype=pl.Float64).alias(_ROW_FLOPS)
    )
    length = pl.col(c.TOTAL_LENGTHS).cast(pl.Int64)
    scheduled = rows.get_column(c.MICRO_BATCH).is_not_null().any()
    cell = [c.RANK, c.TRAIN_STEP, *([c.MICRO_BATCH] if scheduled else [])]
    trained = rows.filter(pl.col(c.TRAIN_STEP).is_not_null())
    cells = (
        trained.group_by(cell)
        .agg((length.max() * pl.len() - length.sum()).alias(PADDING))
        .group_by(c.RANK)
        .agg(
            pl.len().alias(MICRO_BATCHES),
            pl.col(PADDING).sum(),
            pl.col(c.TRAIN_STEP).n_unique().alias(TRAIN_STEPS),
        )
    )
    whole = rows.group_by(c.RANK).agg(
        length.sum().alias(TOKENS),
        (length * length).sum().alias(SQUARED),
        pl.col(_ROW_FLOPS).sum().alias(FLOPS) if flops is not None else pl.lit(None).alias(FLOPS),
        pl.col(c.TRAIN_STEP).is_null().sum().cast(pl.Int64).alias(UNTRAINED),
    )
    dp_size = int(settings.dp_size)
    return (
        pl.DataFrame({c.RANK: pl.int_range(dp_size, dtype=pl.Int32, eager=True)})
        .join(whole, on=c.RANK, how="left")
        .join(cells, on=c.RANK, how="left")
        .select(
            c.RANK,
            pl.col(TOKENS).fill_null(0),
            pl.col(SQUARED).fill_null(0),
            (
                pl.col(FLOPS).cast(pl.Float64).fill_null(0.0)
                if flops is not None
                else pl.lit(None, dtype=pl.Float64).alias(FLOPS)
            ),
            (
                pl.col(MICRO_BATCHES).fill_null(0).cast(pl.Int64)
                if scheduled
                else pl.lit(None, dtype=pl.Int64).alias(MICRO_BATCHES)
            ),
            pl.col(PADDING).fill_null(0).cast(pl.Int64),
            pl.col(TRAIN_STEPS).fill_null(0).cast(pl.Int64),
            pl.col(UNTRAINED).fill_null(0),
        )
    )


def imbalance(ranks: pl.DataFrame) -> dict[str, float | None]:
    """Each measure's largest rank over the mean (null without the figure or with a zero
    mean)."""
    out: dict[str, float | None] = {}
    for name in MEASURES:
        values = ranks.get_column(name)
        mean = values.mean()
        if values.null_count() or mean is None or not isinstance(mean, int | float) or mean == 0:
            out[name] = None
        else:
            out[name] = float(values.max()) / float(mean)  # type: ignore[arg-type]
    return out


def best(plans: Sequence[LayoutPlan], measure: str) -> LayoutPlan | None:
    """The layout of lowest imbalance by `measure` (the first of equals), among those planned."""
    scored = [(p.imbalance()[measure], i, p) for i, p in enumerate(plans) if p.ranks is not None]
    scored = [item for item in scored if item[0] is not None]
    return min(scored, key=lambda item: (item[0], item[1]))[2] if scored else None


def default_measure(plans: Sequence[LayoutPlan]) -> str:
    """FLOPs where the model's shape gives them, else the sum of squared lengths."""
    with_flops = any(
        p.ranks is not None and p.ranks.get_column(FLOPS).null_count() == 0 for p in plans
    )
    return FLOPS if with_flops else SQUARED


def layout_text(layout: dict[str, Any]) -> str:
    return " ".join(f"{name}={value}" for name, value in layout.items()) or "(as given)"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _total(ranks: pl.DataFrame, name: str) -> str:
    values = ranks.get_column(name)
    if values.null_count():
        return "-"
    total = values.sum()
    return f"{total:.4g}" if name == FLOPS else str(int(total))


HEADER = (
    "",
    "layout",
    "tokens",
    "max/mean",
    "sum_sq max/mean",
    "flops",
    "max/mean",
    "micro_batches",
    "max/mean",
    "padding",
    "max/mean",
    "train_steps",
    "untrained",
)


def _row(plan: LayoutPlan, mark: str) -> list[str]:
    assert plan.ranks is not None, "a refused layout has no row"
    ranks, imb = plan.ranks, plan.imbalance()
    return [
        mark,
        layout_text(plan.layout),
        _total(ranks, TOKENS),
        _ratio(imb[TOKENS]),
        _ratio(imb[SQUARED]),
        _total(ranks, FLOPS),
        _ratio(imb[FLOPS]),
        _total(ranks, MICRO_BATCHES),
        _ratio(imb[MICRO_BATCHES]),
        _total(ranks, PADDING),
        _ratio(imb[PADDING]),
        str(int(cast(int, ranks.get_column(TRAIN_STEPS).max() or 0))),  # an integer column
        _total(ranks, UNTRAINED),
    ]


def text_table(plans: Sequence[LayoutPlan], measure: str) -> str:
    """Per step, a row per layout (totals over the ranks, each measure's imbalance, the
    most train steps of a rank, the untrained rows), the best layout marked `*`, then a line
    naming it."""
    lines: list[str] = []
    for step in dict.fromkeys(p.step for p in plans):
        of_step = [p for p in plans if p.step == step]
        chosen = best(of_step, measure)
        planned = [p for p in of_step if p.ranks is not None]
        rows = [list(HEADER), *(_row(p, "*" if p is chosen else "") for p in planned)]
        widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
        lines.append(f"step {step}")
        for r in rows if planned else []:
            cells = [r[0].ljust(1), r[1].ljust(widths[1])]
            cells += [cell.rjust(widths[i]) for i, cell in enumerate(r[2:], start=2)]
            lines.append("  ".join(cells).rstrip())
        for p in of_step:
            if p.ranks is None:
                lines.append(f"   {layout_text(p.layout)}: refused: {p.refused}")
        if chosen is not None:
            lines.append(f"step {step}: best by {measure} imbalance: {layout_text(chosen.layout)}")
    return "\n".join(lines)

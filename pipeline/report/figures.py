"""The report's figures as inline SVG, drawn by the project's own `svg` module.

A page must open without a network (no CDN script), be the same bytes for the same step (it
is a checksummed output) and be written by every install, the smallest one included. Its
figures are columns, bars and lines on two axes: written as SVG strings, they need no
figure library and no extra (docs/report.md says what the libraries tried cost). The
numbers come counted from `data` (the bins too): nothing here computes over rows.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pipeline import columns as c
from pipeline.report import data as d
from pipeline.report import svg
from pipeline.report.svg import BOX, DASHED, HEIGHT, LINE, WIDTH, Plot

if TYPE_CHECKING:
    import polars as pl

TRAINED = "#4c72b0"
TRUNCATED = "#dd8452"
MUTED = "#8c8c8c"
SERIES = (TRAINED, TRUNCATED, MUTED)


def _empty(what: str) -> str:
    """A figure with no data: its one text says why."""
    return (
        f'<svg width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'xmlns="http://www.w3.org/2000/svg"><text x="{WIDTH // 2}" y="{HEIGHT // 2}" '
        f'text-anchor="middle" font-family="{svg.FONT}" font-size="12" fill="{MUTED}">'
        f"{html.escape(what)}</text></svg>"
    )


def _left(labels: Sequence[str]) -> float:
    """The plot area's left side: room for the rotated axis name and the widest label."""
    return 30 + max((svg.width(label, 10) for label in labels), default=0.0)


def _value_axis(top: float) -> list[float]:
    """A value axis from zero to `top` or above (from zero to one when `top` is zero), for
    counts, tokens and FLOPs: no tick between two whole numbers."""
    return svg.ticks(0.0, top, whole=True)


def bin_labels(starts: Sequence[float]) -> list[str]:
    """Each bin's start as a tick label, or the bins numbered where the range is too
    narrow for four digits to tell them apart."""
    labels = [svg.short(start) for start in starts]
    if len(set(labels)) < len(labels):
        return [str(i) for i in range(len(labels))]
    return labels


def _stacked(
    bins: d.Histogram, title: str, x: str, y: str, names: tuple[str, str], top: str, low: str
) -> str:
    """Stacked columns of a histogram: its unmarked rows in `low`'s color, its marked ones
    on top in `top`'s; every fourth bin's start labelled at its left edge."""
    marks = _value_axis(max(bins.total))
    plot = Plot(
        _left([svg.short(mark) for mark in marks]),
        title,
        [(names[1], top, BOX), (names[0], low, BOX)],
    )
    plot.y_axis(marks, y)
    count = len(bins.total)
    for i, (marked, total) in enumerate(zip(bins.marked, bins.total, strict=True)):
        plot.column(i, count, 0, total - marked, low, 0.9)
        plot.column(i, count, total - marked, total, top, 0.9)
    plot.band_labels(bin_labels(bins.starts), at_edge=True)
    plot.x_name(x)
    return plot.svg()


def group_rewards(bins: d.Histogram) -> str:
    """Histogram of the prompt groups' mean rewards, groups of one reward stacked on top."""
    if not bins.rows:
        return _empty("no rows written")
    if not bins.total:
        return _empty("no prompt group has a finite mean reward")
    return _stacked(
        bins,
        f"{bins.marked_rows} of {bins.rows} prompt groups have one reward",
        "mean raw reward of the prompt group",
        "prompt groups",
        ("rewards differ", "one reward (no GRPO signal)"),
        MUTED,
        TRAINED,
    )


def response_lengths(bins: d.Histogram) -> str:
    """Histogram of response lengths, truncated samples stacked on the others."""
    if not bins.rows:
        return _empty("no rows written")
    if not bins.total:
        return _empty("no sample has a response length")
    return _stacked(
        bins,
        f"{bins.marked_rows} of {bins.rows} samples truncated",
        "response length (tokens)",
        "samples",
        ("complete", "truncated"),
        TRUNCATED,
        TRAINED,
    )


def _columns(plot: Plot, labels: list[str], values: Sequence[float], fill: str) -> None:
    for i, value in enumerate(values):
        plot.column(i, len(values), 0, value, fill, 0.8)
    plot.band_labels(labels)


def rank_load(ranks: pl.DataFrame, measure: str = d.TOKENS) -> str:
    """A measure per data-parallel rank (`tokens`, or `flops` where the step has them)
    against their mean."""
    values = ranks.get_column(measure).to_list()
    mean = math.fsum(values) / len(values) if values else 0.0
    most = max(values, default=0)
    level = f"mean {mean:,.0f}" if measure == d.TOKENS else f"mean {svg.short(mean)}"
    marks = _value_axis(most)
    ratio = f"{most / mean:.3f}" if mean else "-"
    plot = Plot(
        _left([svg.short(mark) for mark in marks]),
        f"largest rank / mean = {ratio}",
        [(measure, TRAINED, BOX), (level, TRUNCATED, DASHED)],
    )
    plot.y_axis(marks, "forward FLOPs" if measure == d.FLOPS else measure)
    _columns(plot, [str(rank) for rank in ranks.get_column(c.RANK).to_list()], values, TRAINED)
    y = plot.y(mean)
    plot.parts.append(svg.line(plot.left, y, svg.RIGHT, y, TRUNCATED, dash=True))
    plot.x_name("data-parallel rank")
    return plot.svg()


def staleness(lags: pl.DataFrame) -> str:
    """Written rows per weight-version lag."""
    if lags.is_empty():
        return _empty("no numeric weight versions in this step")
    rows = lags.get_column(d.ROWS).to_list()
    marks = _value_axis(max(rows))
    plot = Plot(_left([svg.short(mark) for mark in marks]))
    plot.y_axis(marks, "samples")
    _columns(plot, [str(lag) for lag in lags.get_column(d.STALENESS).to_list()], rows, TRAINED)
    plot.x_name("weight versions behind the step (oldest version of the sample)")
    return plot.svg()


# A rule's label is cut to this many characters (the plot keeps half the figure's width).
RULE_CHARS = 40


def quarantine(rules: pl.DataFrame) -> str:
    """Quarantined rows per rule, the rule with most rows at the top."""
    if rules.is_empty():
        return _empty("nothing quarantined")
    rows = rules.get_column(d.ROWS).to_list()
    names = [
        name if len(name) <= RULE_CHARS else name[: RULE_CHARS - 1] + "\u2026"
        for name in rules.get_column(d.RULE).to_list()
    ]
    plot = Plot(12 + max(svg.width(name, 10) for name in names))
    plot.x_axis(_value_axis(max(rows)), "quarantined rows")
    for i, value in enumerate(rows):
        plot.bar(i, len(rows), value, TRUNCATED)
    plot.row_labels(names)
    return plot.svg()


def trend(steps: Sequence[int], series: dict[str, list[float | None]], ylabel: str) -> str:
    """Lines of one value or more across steps (the index page), a dot on each step; a
    legend where there are several."""
    known = [
        value
        for values in series.values()
        for value in values
        if value is not None and math.isfinite(value)
    ]
    if not known:
        return _empty("no step has this value")
    colors = [SERIES[i % len(SERIES)] for i in range(len(series))]
    legend = [(label, color, LINE) for label, color in zip(series, colors, strict=True)]
    marks = svg.ticks(min(0.0, *known), max(known))
    plot = Plot(
        _left([svg.short(mark) for mark in marks]), legend=legend if len(legend) > 1 else []
    )
    plot.y_axis(marks, ylabel)
    first, last = min(steps), max(steps)
    last = last if last > first else first + 1
    shown = (
        list(steps)
        if len(steps) <= 12
        else [mark for mark in svg.ticks(first, last) if first <= mark <= last]
    )
    plot.x_axis([first, last], "step", shown)
    for values, color in zip(series.values(), colors, strict=True):
        moves, dots, pen = [], [], "M"
        for step, value in zip(steps, values, strict=True):
            if value is None or not math.isfinite(value):
                pen = "M"  # a step without the value breaks the line
                continue
            x, y = plot.x(step), plot.y(value)
            moves.append(f"{pen}{svg.num(x)} {svg.num(y)}")
            dots.append(svg.circle(x, y, 3, color))
            pen = "L"
        plot.parts.append(svg.path(moves, color, 2))
        plot.parts.extend(dots)
    return plot.svg()

"""The report's figures as inline SVG, drawn with leather (the `report` extra).

Why leather: a page must open without a network (no CDN script) and be the same bytes for
the same step (it is a checksummed output), and drawing it must not slow the build down.
leather is pure Python without dependencies: its import and a page's five charts take a few
hundredths of a second where Matplotlib's took about one cpu-second (docs/report.md). It
writes plain SVG elements (rect, line, path, text) with no ids, no date and no script, from
an ElementTree, so the same numbers give the same bytes.

leather has no histogram: the bins are counted here with Polars on the figure's numbers
(one row per group or sample), and a stacked column is two columns drawn one over the
other (the total behind, the lower part in front).
"""

from __future__ import annotations

import html
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import Any

import leather
import polars as pl
from leather import theme
from leather.shapes.base import Shape

from pipeline import columns as c
from pipeline.report import data as d

WIDTH, HEIGHT = 560, 280
TRAINED = "#4c72b0"
TRUNCATED = "#dd8452"
MUTED = "#8c8c8c"
_FONT = "system-ui, sans-serif"

# leather's look is its module's settings: set once here, for every chart of the process
# (the page's size and sans-serif font in place of its 800x600 Monaco defaults).
theme.background_color = "#ffffff"
theme.margin = 0.03
for _part, _size in (("title", 13), ("legend", 11), ("axis_title", 11), ("tick", 10)):
    setattr(theme, f"{_part}_font_family", _FONT)
    setattr(theme, f"{_part}_font_size", _size)
    setattr(theme, f"{_part}_font_char_height", _size)
    setattr(theme, f"{_part}_font_char_width", round(_size * 0.6))
theme.axis_title_gap = 16
theme.tick_color = "#e6e6e6"
theme.label_color = "#555555"
theme.axis_title_color = "#333333"
theme.legend_color = "#333333"
theme.title_color = "#222222"


class _Marks(leather.Dots):  # type: ignore[misc]
    """Dots on a line's points, not listed again in the legend (the line is)."""

    def legend_to_svg(self, series: Any, palette: Any) -> list[Any]:
        return []


class _QuietLine(leather.Line):  # type: ignore[misc]
    """The line of a chart's one series: the axis names it, no legend."""

    def legend_to_svg(self, series: Any, palette: Any) -> list[Any]:
        return []


class _Level(Shape):  # type: ignore[misc]
    """A dashed horizontal line across the chart at its series' one y value (the mean)."""

    def __init__(self, color: str) -> None:
        self._stroke_color = color

    def validate_series(self, series: Any) -> None:
        """Any series: only its first y value is drawn."""

    def to_svg(
        self, width: Any, height: Any, x_scale: Any, y_scale: Any, series: Any, palette: Any
    ) -> ET.Element:
        y = str(y_scale.project(next(iter(series.data())).y, height, 0))
        group = ET.Element("g")
        group.set("class", "series level")
        line = ET.Element("line", x1="0", y1=y, x2=str(width), y2=y, stroke=self._stroke_color)
        line.set("stroke-dasharray", "6 4")
        line.set("stroke-width", "1.5")
        group.append(line)
        return group


def _svg(chart: Any) -> str:
    """The chart as an `<svg>` element (no XML prologue: it is inline in HTML)."""
    root = ET.Element(
        "svg",
        width=str(WIDTH),
        height=str(HEIGHT),
        viewBox=f"0 0 {WIDTH} {HEIGHT}",
        xmlns="http://www.w3.org/2000/svg",
    )
    root.append(chart.to_svg_group(WIDTH, HEIGHT))
    return ET.tostring(root, encoding="unicode")


def _empty(what: str) -> str:
    """A figure with no data: its one text says why."""
    return (
        f'<svg width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'xmlns="http://www.w3.org/2000/svg"><text x="{WIDTH // 2}" y="{HEIGHT // 2}" '
        f'text-anchor="middle" font-family="{_FONT}" font-size="12" fill="{MUTED}">'
        f"{html.escape(what)}</text></svg>"
    )


def _short(value: float) -> str:
    """A tick label: at most four significant digits, thousands as k, millions as M, then
    G, T and P (a rank's FLOPs)."""
    for scale, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G")):
        if abs(value) >= scale:
            return f"{value / scale:.4g}{suffix}"
    if abs(value) >= 1_000_000:
        return f"{value / 1_000_000:.4g}M"
    if abs(value) >= 10_000:
        return f"{value / 1000:.4g}k"
    return f"{value:.4g}"


def _tick(value: Any, index: int, count: int) -> str:
    return _short(float(value))


def _y_scale(chart: Any, top: float) -> None:
    # from zero, and never an empty domain (leather divides by its width)
    chart.add_y_scale(0, top if top > 0 else 1)


def _finite(frame: pl.DataFrame, value: str) -> pl.DataFrame:
    """The rows whose `value` can be binned: a NaN, infinite or null reward (a group of
    rows without one) is counted in the title but has no bin."""
    return frame.filter(pl.col(value).cast(pl.Float64).is_finite().fill_null(False))


def _histogram(frame: pl.DataFrame, value: str, upper: pl.Expr, bins: int) -> pl.DataFrame:
    """`bins` equal bins over `value`'s range: each bin's start (`label`), its rows where
    `upper` holds and all its rows (`total`)."""
    low, high = frame.select(pl.col(value).min().alias("low"), pl.col(value).max()).row(0)
    low, high = float(low), float(high)
    bins = bins if high > low else 1
    width = (high - low) / bins if high > low else 1.0
    index = ((pl.col(value) - low) / width).floor().cast(pl.Int64).clip(0, bins - 1)
    counts = frame.group_by(index.alias("bin")).agg(
        upper.cast(pl.Int64).sum().alias("upper"), pl.len().cast(pl.Int64).alias("total")
    )
    full = (
        pl.DataFrame({"bin": pl.int_range(bins, eager=True, dtype=pl.Int64)})
        .join(counts, on="bin", how="left")
        .with_columns(pl.col("upper", "total").fill_null(0))
        .sort("bin")
    )
    labels = [_short(low + i * width) for i in range(bins)]
    if len(set(labels)) < bins:  # a range too narrow for four digits: number the bins
        labels = [str(i) for i in range(bins)]
    return full.with_columns(pl.Series("label", labels))


def _stacked(
    bins: pl.DataFrame, title: str, x: str, y: str, names: tuple[str, str], top: str, low: str
) -> str:
    """Stacked columns of a `_histogram`: the lower part (`total - upper`) in `low`'s color
    in front of the whole column in `top`'s; every fourth bin labelled."""
    labels = bins.get_column("label").to_list()
    totals = bins.get_column("total").to_list()
    lower = (bins.get_column("total") - bins.get_column("upper")).to_list()
    chart = leather.Chart(title)
    _y_scale(chart, max(totals))
    chart.add_x_axis(ticks=labels[::4], name=x)
    chart.add_y_axis(name=y, tick_formatter=_tick)
    chart.add_columns(list(zip(labels, totals, strict=True)), name=names[1], fill_color=top)
    chart.add_columns(list(zip(labels, lower, strict=True)), name=names[0], fill_color=low)
    return _svg(chart)


def group_rewards(groups: pl.DataFrame) -> str:
    """Histogram of the prompt groups' mean rewards, groups of one reward stacked on top."""
    if groups.is_empty():
        return _empty("no rows written")
    binned = _finite(groups, d.GROUP_MEAN)
    if binned.is_empty():
        return _empty("no prompt group has a finite mean reward")
    one = int(groups.get_column(d.ONE_REWARD).sum())
    return _stacked(
        _histogram(binned, d.GROUP_MEAN, pl.col(d.ONE_REWARD), 20),
        f"{one} of {groups.height} prompt groups have one reward",
        "mean raw reward of the prompt group",
        "prompt groups",
        ("rewards differ", "one reward (no GRPO signal)"),
        MUTED,
        TRAINED,
    )


def response_lengths(lengths: pl.DataFrame) -> str:
    """Histogram of response lengths, truncated samples stacked on the others."""
    if lengths.is_empty():
        return _empty("no rows written")
    cut = int(lengths.get_column(c.TRUNCATED).sum())
    return _stacked(
        _histogram(
            _finite(lengths, c.RESPONSE_LENGTHS), c.RESPONSE_LENGTHS, pl.col(c.TRUNCATED), 24
        ),
        f"{cut} of {lengths.height} samples truncated",
        "response length (tokens)",
        "samples",
        ("complete", "truncated"),
        TRUNCATED,
        TRAINED,
    )


def rank_load(ranks: pl.DataFrame, measure: str = d.TOKENS) -> str:
    """A measure per data-parallel rank (`tokens`, or `flops` where the step has them)
    against their mean."""
    stats = ranks.select(pl.col(measure).mean().alias("mean"), pl.col(measure).max())
    mean, most = float(stats.item(0, 0) or 0.0), float(stats.item(0, 1) or 0.0)
    names = [str(rank) for rank in ranks.get_column(c.RANK).to_list()]
    values = ranks.get_column(measure).to_list()
    ratio = f"{most / mean:.3f}" if mean else "-"
    chart = leather.Chart(f"largest rank / mean = {ratio}")
    _y_scale(chart, most)
    chart.add_x_axis(name="data-parallel rank")
    axis = "forward FLOPs" if measure == d.FLOPS else measure
    chart.add_y_axis(name=axis, tick_formatter=_tick)
    chart.add_columns(list(zip(names, values, strict=True)), name=measure, fill_color=TRAINED)
    level = f"mean {mean:,.0f}" if measure == d.TOKENS else f"mean {_short(mean)}"
    chart.add_series(leather.Series([(names[0], mean)], name=level), _Level(TRUNCATED))
    return _svg(chart)


def staleness(lags: pl.DataFrame) -> str:
    """Written rows per weight-version lag."""
    if lags.is_empty():
        return _empty("no numeric weight versions in this step")
    rows = lags.get_column(d.ROWS).to_list()
    chart = leather.Chart()
    _y_scale(chart, max(rows))
    chart.add_x_axis(name="weight versions behind the step (oldest version of the sample)")
    chart.add_y_axis(name="samples", tick_formatter=_tick)
    lag = [str(v) for v in lags.get_column(d.STALENESS).to_list()]
    chart.add_columns(list(zip(lag, rows, strict=True)), fill_color=TRAINED)
    return _svg(chart)


def quarantine(rules: pl.DataFrame) -> str:
    """Quarantined rows per rule."""
    if rules.is_empty():
        return _empty("nothing quarantined")
    rows = rules.get_column(d.ROWS).to_list()
    chart = leather.Chart()
    chart.add_x_scale(0, max(rows))
    chart.add_x_axis(name="quarantined rows", tick_formatter=_tick)
    names = rules.get_column("rule").to_list()
    chart.add_bars(list(zip(rows, names, strict=True)), fill_color=TRUNCATED)
    return _svg(chart)


def trend(steps: Sequence[int], series: dict[str, list[float | None]], ylabel: str) -> str:
    """Lines of one value or more across steps (the index page), a dot on each step."""
    known = [v for values in series.values() for v in values if v is not None]
    if not known:
        return _empty("no step has this value")
    chart = leather.Chart()
    first, last = min(steps), max(steps)
    chart.add_x_scale(first, last if last > first else first + 1)
    chart.add_x_axis(
        ticks=list(steps) if len(steps) <= 12 else None,
        tick_formatter=_tick,
        name="step",
    )
    low, high = min(0.0, *known), max(known)
    chart.add_y_scale(low, high if high > low else low + 1)
    chart.add_y_axis(name=ylabel, tick_formatter=_tick)
    colors = iter((TRAINED, TRUNCATED, MUTED))
    for label, values in series.items():
        points = list(zip(steps, values, strict=True))
        color = next(colors)
        if len(series) > 1:
            chart.add_line(points, name=label, stroke_color=color)
        else:
            chart.add_series(leather.Series(points), _QuietLine(stroke_color=color))
        chart.add_series(leather.Series(points), _Marks(fill_color=color))
    return _svg(chart)

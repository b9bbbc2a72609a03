"""The report's figures as inline SVG, drawn with Matplotlib (the `report` extra).

Why Matplotlib's SVG: a page must open without a network (no CDN script) and be the same
bytes for the same step (it is a checksummed output). Matplotlib's SVG backend writes text
as paths in its own bundled font, ids from a fixed hash salt and, without a date in its
metadata, nothing of the moment it ran; a step's page holds no script. Plotly or Vega
pages would carry their whole library inline in every page instead (a CDN is no option:
pages are read where there is no network).

Only the object API is used (no pyplot: no global figure registry, no GUI backend), and one
lock keeps the rc settings of one drawing from another thread's.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import polars as pl
from matplotlib import rc_context
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from pipeline import columns as c
from pipeline.report import data as d
from pipeline.speed import one_at_a_time

# Fixed ids (the hash salt) and no creation date or creator: the same figure, the same bytes.
_RC: dict[str, Any] = {
    "svg.hashsalt": "rollout-shards",
    # text as SVG text in the page's sans-serif: drawing each glyph as a path costs most of
    # a figure's time and bytes
    "svg.fonttype": "none",
    "text.parse_math": False,
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
_METADATA = {"Date": None, "Creator": None}
_SIZE = (5.6, 2.8)
_LOCK = one_at_a_time()
TRAINED = "#4c72b0"
TRUNCATED = "#dd8452"
MUTED = "#8c8c8c"


@contextmanager
def _figure() -> Iterator[tuple[Figure, Any]]:
    # fixed margins: a layout engine measures every label again on each draw
    figure = Figure(figsize=_SIZE)
    figure.subplots_adjust(left=0.11, right=0.98, bottom=0.17, top=0.9)
    FigureCanvasSVG(figure)
    yield figure, figure.add_subplot()


def svg(draw: Callable[[Any], None]) -> str:
    """The figure `draw` draws on one axes, as SVG text without the XML prologue (inline in
    HTML)."""
    with _LOCK, rc_context(_RC), _figure() as (figure, axes):  # type: ignore[arg-type]
        draw(axes)
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg", metadata=_METADATA)
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _empty(axes: Any, what: str) -> None:
    axes.set_axis_off()
    axes.text(0.5, 0.5, what, ha="center", va="center", color=MUTED, transform=axes.transAxes)


def group_rewards(groups: pl.DataFrame) -> str:
    """Histogram of the prompt groups' mean rewards, groups of one reward apart."""

    def draw(axes: Any) -> None:
        if groups.is_empty():
            return _empty(axes, "no rows written")
        one = groups.filter(pl.col(d.ONE_REWARD)).get_column(d.GROUP_MEAN).to_numpy()
        varied = groups.filter(~pl.col(d.ONE_REWARD)).get_column(d.GROUP_MEAN).to_numpy()
        axes.hist(
            [varied, one],
            bins=20,
            stacked=True,
            color=[TRAINED, MUTED],
            label=["rewards differ", "one reward (no GRPO signal)"],
        )
        axes.set_xlabel("mean raw reward of the prompt group")
        axes.set_ylabel("prompt groups")
        axes.set_title(f"{len(one)} of {groups.height} prompt groups have one reward")
        axes.legend(frameon=False, loc="upper right")  # "best" searches the data

    return svg(draw)


def response_lengths(lengths: pl.DataFrame) -> str:
    """Histogram of response lengths, truncated samples stacked on the others."""

    def draw(axes: Any) -> None:
        if lengths.is_empty():
            return _empty(axes, "no rows written")
        cut = pl.col(c.TRUNCATED)
        whole = lengths.filter(~cut).get_column(c.RESPONSE_LENGTHS).to_numpy()
        truncated = lengths.filter(cut).get_column(c.RESPONSE_LENGTHS).to_numpy()
        axes.hist(
            [whole, truncated],
            bins=30,
            stacked=True,
            color=[TRAINED, TRUNCATED],
            label=["complete", "truncated"],
        )
        axes.set_xlabel("response length (tokens)")
        axes.set_ylabel("samples")
        axes.set_title(f"{len(truncated)} of {lengths.height} samples truncated")
        axes.legend(frameon=False, loc="upper right")  # "best" searches the data

    return svg(draw)


def rank_load(ranks: pl.DataFrame) -> str:
    """Tokens per data-parallel rank against their mean."""

    def draw(axes: Any) -> None:
        stats = ranks.select(pl.col(d.TOKENS).mean().alias("mean"), pl.col(d.TOKENS).max())
        mean, most = float(stats.item(0, 0) or 0.0), int(stats.item(0, 1) or 0)
        tokens = ranks.get_column(d.TOKENS)
        numbers = ranks.get_column(c.RANK).to_numpy()
        axes.bar(numbers, tokens.to_numpy(), color=TRAINED)
        axes.set_xticks(numbers)
        axes.axhline(mean, color=TRUNCATED, linestyle="--", label=f"mean {mean:,.0f}")
        axes.set_xlabel("data-parallel rank")
        axes.set_ylabel("tokens")
        ratio = f"{most / mean:.3f}" if mean else "-"
        axes.set_title(f"largest rank / mean = {ratio}")
        axes.legend(frameon=False, loc="upper right")  # "best" searches the data

    return svg(draw)


def staleness(lags: pl.DataFrame) -> str:
    """Written rows per weight-version lag."""

    def draw(axes: Any) -> None:
        if lags.is_empty():
            return _empty(axes, "no numeric weight versions in this step")
        lag = lags.get_column(d.STALENESS).to_numpy()
        axes.bar(lag, lags.get_column(d.ROWS).to_numpy(), color=TRAINED)
        axes.set_xticks(lag)
        axes.set_xlabel("weight versions behind the step (oldest version of the sample)")
        axes.set_ylabel("samples")

    return svg(draw)


def quarantine(rules: pl.DataFrame) -> str:
    """Quarantined rows per rule."""

    def draw(axes: Any) -> None:
        if rules.is_empty():
            return _empty(axes, "nothing quarantined")
        names = rules.get_column("rule").to_list()[::-1]
        axes.barh(names, rules.get_column(d.ROWS).to_numpy()[::-1], color=TRUNCATED)
        axes.set_xlabel("quarantined rows")

    return svg(draw)


def trend(steps: list[int], series: dict[str, list[float | None]], ylabel: str) -> str:
    """Lines of one value or more across steps (the index page)."""

    def draw(axes: Any) -> None:
        if all(v is None for values in series.values() for v in values):
            return _empty(axes, "no step has this value")
        for label, values in series.items():
            axes.plot(
                steps, [float("nan") if v is None else v for v in values], marker="o", label=label
            )
        axes.set_xlabel("step")
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.set_ylabel(ylabel)
        if len(series) > 1:
            axes.legend(frameon=False, loc="upper right")  # "best" searches the data

    return svg(draw)

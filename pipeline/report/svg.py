"""The report's own SVG drawing: a chart's elements written as strings.

A figure is a handful of rectangles, lines, paths, circles and texts on two axes, so it is
written here directly: no figure library to install or import, no element tree, and every
install draws the same page. Every text goes through
`html.escape`, every coordinate is rounded to one decimal and nothing carries an id or a
date, so the same numbers give the same bytes (the page is a checksummed output). The text
is SVG text in the reader's sans-serif font: nothing is measured when a page is written, so
its widths are estimated from the number of characters (`CHAR`).
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence

WIDTH, HEIGHT = 560, 280
FONT = "system-ui, sans-serif"
BACKGROUND = "#ffffff"
GRID = "#e6e6e6"
ZERO = "#a8a8a8"  # the axis line at zero, darker than the grid
LABEL = "#555555"
NAME = "#333333"  # axis names and legend entries
TITLE = "#222222"
CHAR = 0.6  # an average character's width in em, for laying out labels
RIGHT = WIDTH - 16  # the plot area's right side
BOTTOM = HEIGHT - 42  # its bottom: below it the x labels and the x axis name
BOX, LINE, DASHED = "box", "line", "dashed"  # how a legend entry shows its series
DASH = "6 4"
ROW = 36  # the most a bar's row (a quarantine rule) takes down the plot


def num(value: float) -> str:
    """A coordinate: one decimal at most, no "-0"."""
    text = f"{value:.1f}".removesuffix(".0")
    return "0" if text == "-0" else text


def short(value: float) -> str:
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


def ticks(low: float, high: float, whole: bool = False) -> list[float]:
    """An axis from a round number at or below `low` to one at or above `high`, in three to
    six steps of 1, 2 or 5 times a power of ten ("nice numbers"); steps of one at least
    where the values are `whole` numbers (counts)."""
    if not high > low:
        high = low + 1
    raw = (high - low) / 6
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(power * m for m in (1, 2, 5, 10) if power * m >= raw * (1 - 1e-9))
    step = max(step, 1.0) if whole else step
    first = math.floor(low / step + 1e-9)
    last = math.ceil(high / step - 1e-9)
    return [i * step for i in range(first, last + 1)]


def width(text: str, size: float) -> float:
    """The estimated width of `text` at font size `size`."""
    return len(text) * CHAR * size


def text(x: float, y: float, content: str, size: int, fill: str, anchor: str = "") -> str:
    """A text whose baseline starts (`anchor` "": the default), is centred ("middle") or
    ends ("end") at x, y."""
    at = f' text-anchor="{anchor}"' if anchor else ""
    return (
        f'<text x="{num(x)}" y="{num(y)}"{at} font-size="{size}" fill="{fill}">'
        f"{html.escape(content)}</text>"
    )


def rect(x: float, y: float, w: float, h: float, fill: str) -> str:
    return f'<rect x="{num(x)}" y="{num(y)}" width="{num(w)}" height="{num(h)}" fill="{fill}"/>'


def line(x1: float, y1: float, x2: float, y2: float, stroke: str, dash: bool = False) -> str:
    dashes = f' stroke-dasharray="{DASH}" stroke-width="1.5"' if dash else ""
    return (
        f'<line x1="{num(x1)}" y1="{num(y1)}" x2="{num(x2)}" y2="{num(y2)}" '
        f'stroke="{stroke}"{dashes}/>'
    )


def path(moves: Iterable[str], stroke: str, stroke_width: float = 1) -> str:
    """A path of `moves` ("M x y", "L x y", "H x", ...), stroked, not filled."""
    return (
        f'<path d="{"".join(moves)}" fill="none" stroke="{stroke}" '
        f'stroke-width="{num(stroke_width)}"/>'
    )


def circle(x: float, y: float, r: float, fill: str) -> str:
    return f'<circle cx="{num(x)}" cy="{num(y)}" r="{num(r)}" fill="{fill}"/>'


def svg(parts: Iterable[str]) -> str:
    """The figure's `<svg>` element (no XML prologue: it is inline in HTML, and a data URI
    of it is an image of its own)."""
    return (
        f'<svg width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'xmlns="http://www.w3.org/2000/svg" font-family="{FONT}">'
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="{BACKGROUND}"/>' + "".join(parts) + "</svg>"
    )


class Plot:
    """One chart being drawn: its title and legend above the plot area, the axes, then the
    marks in the order they are added (a later one over an earlier one)."""

    def __init__(
        self,
        left: float,
        title: str = "",
        legend: Sequence[tuple[str, str, str]] = (),
    ) -> None:
        """`left` the plot area's left side; `legend` (label, color, BOX | LINE | DASHED)
        per entry."""
        self.left = left
        self.parts: list[str] = []
        baseline = 0
        if title:
            baseline += 20
            self.parts.append(text(left, baseline, title, 13, TITLE))
        if legend:
            baseline += 18
            x = left
            for label, color, kind in legend:
                if kind == BOX:
                    self.parts.append(rect(x, baseline - 9, 10, 10, color))
                    x += 14
                else:
                    middle = baseline - 4
                    self.parts.append(line(x, middle, x + 18, middle, color, kind == DASHED))
                    x += 22
                self.parts.append(text(x, baseline, label, 11, NAME))
                x += width(label, 11) + 18
        self.top = baseline + 14 if baseline else 14
        self.y_low, self.y_high = 0.0, 1.0  # the value axes' ends
        self.x_low, self.x_high = 0.0, 1.0

    def y(self, number: float) -> float:
        """The y of a value on the y axis."""
        share = (number - self.y_low) / (self.y_high - self.y_low)
        return BOTTOM - share * (BOTTOM - self.top)

    def x(self, number: float) -> float:
        """The x of a value on the x axis."""
        share = (number - self.x_low) / (self.x_high - self.x_low)
        return self.left + share * (RIGHT - self.left)

    def y_axis(self, marks: list[float], name: str) -> None:
        """A value axis up the left side, its ticks `marks` (`ticks`), a grid line on each
        and `name` along it."""
        self.y_low, self.y_high = marks[0], marks[-1]
        grid = []
        for mark in marks:
            y = self.y(mark)
            if mark == 0:
                self.parts.append(line(self.left, y, RIGHT, y, ZERO))
            else:
                grid.append(f"M{num(self.left)} {num(y)}H{RIGHT}")
            self.parts.append(text(self.left - 6, y + 3.5, short(mark), 10, LABEL, "end"))
        self._grid(grid)
        self.y_name(name)

    def _grid(self, moves: list[str]) -> None:
        """Grid lines, one path under every other mark."""
        if moves:
            self.parts.insert(0, path(moves, GRID))

    def y_name(self, name: str) -> None:
        middle = (self.top + BOTTOM) / 2
        self.parts.append(
            f'<text x="16" y="{num(middle)}" text-anchor="middle" '
            f'transform="rotate(-90 16 {num(middle)})" font-size="11" fill="{NAME}">'
            f"{html.escape(name)}</text>"
        )

    def x_axis(self, marks: list[float], name: str, labels: Sequence[float] | None = None) -> None:
        """A value axis along the bottom from `marks[0]` to `marks[-1]`, a grid line and a
        label on each of `labels` (default: the marks)."""
        self.x_low, self.x_high = marks[0], marks[-1]
        grid = []
        for mark in marks if labels is None else labels:
            x = self.x(mark)
            if mark == 0:
                self.parts.append(line(x, self.top, x, BOTTOM, ZERO))
            else:
                grid.append(f"M{num(x)} {num(self.top)}V{BOTTOM}")
            self.parts.append(text(x, BOTTOM + 14, short(mark), 10, LABEL, "middle"))
        self._grid(grid)
        self.x_name(name)

    def x_name(self, name: str) -> None:
        middle = (self.left + RIGHT) / 2
        self.parts.append(text(middle, HEIGHT - 10, name, 11, NAME, "middle"))

    def bands(self, count: int) -> float:
        """The width of each of `count` equal bands across the plot area."""
        return (RIGHT - self.left) / count

    def band_labels(self, labels: Sequence[str], at_edge: bool = False) -> None:
        """Category labels under the bands: at each band's centre, as many as fit apart
        (at its left edge: every fourth, the bins' starts)."""
        band = self.bands(len(labels))
        widest = max((width(label, 10) for label in labels), default=0.0)
        every = 4 if at_edge else max(1, math.ceil((widest + 8) / band))
        for i in range(0, len(labels), every):
            x = self.left + band * i + (0 if at_edge else band / 2)
            self.parts.append(text(x, BOTTOM + 14, labels[i], 10, LABEL, "middle"))

    def column(self, i: int, count: int, low: float, high: float, fill: str, share: float) -> None:
        """The `i`th of `count` columns from value `low` up to `high`, `share` of its band
        wide; none where it has no height."""
        if high <= low:
            return
        band = self.bands(count)
        top, bottom = round(self.y(high), 1), round(self.y(low), 1)
        x = self.left + band * (i + (1 - share) / 2)
        self.parts.append(rect(x, top, band * share, bottom - top, fill))

    def rows(self, count: int) -> float:
        """The height of each of `count` rows of bars down the plot area, at most `ROW`:
        a rule or two would otherwise be drawn as slabs."""
        return min((BOTTOM - self.top) / count, ROW)

    def bar(self, i: int, count: int, value: float, fill: str, share: float = 0.8) -> None:
        """The `i`th of `count` bars from the top, from zero across to `value`."""
        if value <= 0:
            return
        band = self.rows(count)
        self.parts.append(
            rect(
                self.left,
                self.top + band * (i + (1 - share) / 2),
                self.x(value) - self.left,
                band * share,
                fill,
            )
        )

    def row_labels(self, labels: Sequence[str]) -> None:
        """A label at the left of each of the bars, the first at the top."""
        band = self.rows(len(labels))
        for i, label in enumerate(labels):
            y = self.top + band * (i + 0.5) + 3.5
            self.parts.append(text(self.left - 6, y, label, 10, LABEL, "end"))

    def svg(self) -> str:
        return svg(self.parts)

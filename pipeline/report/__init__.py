"""A step's report page (`step=N/report.html`) and the index across steps.

Drawn by the project's own SVG code (`figures`, `svg`), so every install writes it; the
writer imports this package for its name, and what draws is imported when a page is drawn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl

    from pipeline.manifest import Manifest

REPORT = "report.html"


def render_step(rows: pl.DataFrame, meta: Manifest, quarantine: pl.DataFrame | None) -> bytes:
    """The report page of a planned step: `rows` its `TrainBatch.report_rows()`, `meta` its
    manifest (counts, stats), `quarantine` its quarantined rows; UTF-8 HTML."""
    from pipeline.report import data, page

    numbers = data.step_figures(rows, meta, quarantine)
    return page.step_page(numbers).encode()

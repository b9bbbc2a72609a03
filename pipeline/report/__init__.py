"""A step's report page (`step=N/report.html`) and the index across steps.

The figure library (leather) comes with the `report` extra, never with the core or the
loader: `render_step` is called by the writer only where it is installed, and everything
that draws is imported inside it, so a build that writes no report never loads it.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl

    from pipeline.manifest import Manifest

REPORT = "report.html"
EXTRA = "report"
_TOLD: list[bool] = []


def available() -> bool:
    """Whether the figure library is installed."""
    return importlib.util.find_spec("leather") is not None


def tell_missing() -> None:
    """Say once per process, on stderr, that steps are built without their report."""
    if not _TOLD:
        _TOLD.append(True)
        print(
            f"rollout-shards: no {REPORT} written for the steps built here: the figure "
            f"library is not installed (pip install 'rollout-shards[{EXTRA}]' writes one); "
            "their manifests say report: null",
            file=sys.stderr,
        )


def render_step(rows: pl.DataFrame, meta: Manifest, quarantine: pl.DataFrame | None) -> bytes:
    """The report page of a planned step: `rows` its `TrainBatch.report_rows()`, `meta` its
    manifest (counts, stats), `quarantine` its quarantined rows; UTF-8 HTML."""
    from pipeline.report import data, page

    numbers = data.step_figures(rows, meta, quarantine)
    return page.step_page(numbers).encode()

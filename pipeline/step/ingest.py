"""Ingest one step: read its files, type them, repair legacy ids if asked, validate.

The `rollout_samples` asset and `rollout-shards validate` stop here; `plan` takes over.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from pipeline import columns as c
from pipeline.columns import PATH_STEP, REASON, ROW_ID, TYPE_ERROR
from pipeline.errors import StepError
from pipeline.io import readers
from pipeline.io.readers import SourceFile, input_records, load_step
from pipeline.schemas.validate import RuleFailure, validate_step
from pipeline.settings import Settings
from pipeline.transforms.repair import CLEARED, STAMPED, repair_rollout_ids

PROVENANCE = (c.SOURCE_FILE, c.SOURCE_ROW, PATH_STEP)
# Provenance as the quarantine table names it: where to find the row as it was written.
QUARANTINE_PROVENANCE = {c.SOURCE_FILE: "source_file", c.SOURCE_ROW: "source_row"}
SIBLING = "sibling of an invalid leaf: "


@dataclass
class SampleTable:
    """A step's valid rows in batch order (the `rollout_samples` asset)."""

    step: int
    frame: pl.DataFrame
    files: list[dict[str, Any]]  # path, sha256 and rows of each input file
    ignored_columns: list[str]
    ingested: int
    repaired: dict[str, int] = field(default_factory=dict)
    quarantine: pl.DataFrame | None = None
    # The light columns of `frame` (`transforms.samples.light_columns`) as validation
    # computed them, for the plan; None when not at hand (a staged batch).
    light: pl.DataFrame | None = None
    # The files' sha256 while still being computed (then `files` has path and rows only).
    digests: list[Future[str]] | None = None
    # The row and cross-row rules while still being checked (`load_samples(defer_rules=True)`).
    pending_rules: Future[tuple[list[RuleFailure], float]] | None = None

    def settle(self) -> float | None:
        """Wait for the rules still being checked; one that broke fails the step with the
        violations `load_samples` would have raised. Nothing of a step may be published, or
        handed to another stage, before it is settled. Returns when the rules were done
        (`time.perf_counter`), None when none were pending."""
        if self.pending_rules is None:
            return None
        failures, done = self.pending_rules.result()
        self.pending_rules = None
        if failures:
            raise StepError([failure.violation for failure in failures])
        return done

    @property
    def inputs(self) -> list[dict[str, Any]]:
        """path, sha256 and rows of each input file. Asked for last, by the plan's
        manifest: a digest the program began early has validation and the plan to finish
        in, while a core is often idle."""
        if self.digests is not None:
            self.files, self.digests = input_records(self.files, self.digests), None
        return self.files


def quarantine_table(loaded: pl.DataFrame, failing: pl.DataFrame) -> pl.DataFrame:
    """Every row of each trajectory holding a failing row, as loaded (before any repair),
    in batch order, with a `reason`: the failing row's rules, or for its siblings
    "sibling of an invalid leaf: " and the rules their trajectory broke."""
    own = failing.group_by(ROW_ID, maintain_order=True).agg(
        pl.col(REASON).unique(maintain_order=True).str.join("; ")
    )
    trajectory = (
        failing.join(loaded.select(ROW_ID, *c.TRAJECTORY), on=ROW_ID, maintain_order="left")
        .group_by(*c.TRAJECTORY, maintain_order=True)
        .agg(pl.col(REASON).unique(maintain_order=True).str.join("; ").alias("_trajectory"))
    )
    touched = pl.col(ROW_ID).is_in(failing.get_column(ROW_ID).implode()).any().over(c.TRAJECTORY)
    return (
        loaded.filter(touched)
        .join(own, on=ROW_ID, how="left", maintain_order="left")
        .join(
            trajectory, on=list(c.TRAJECTORY), how="left", nulls_equal=True, maintain_order="left"
        )
        .with_columns(pl.coalesce(REASON, pl.lit(SIBLING) + pl.col("_trajectory")).alias(REASON))
        .drop(ROW_ID, PATH_STEP, "_trajectory")
        .rename(QUARANTINE_PROVENANCE)
        .select(
            pl.exclude(*QUARANTINE_PROVENANCE.values(), REASON),
            *QUARANTINE_PROVENANCE.values(),
            REASON,
        )
    )


def load_samples(
    step: int, sources: Sequence[SourceFile], settings: Settings, defer_rules: bool = False
) -> SampleTable:
    """Read a step, repair legacy ids if asked, validate. With `on_invalid: fail` any broken
    rule fails the step; with `quarantine` the trajectories holding a failing row are set
    aside whole and the rest goes on. Problems that name no rows (an unreadable file, a
    missing column, a column of an impossible type, a struct reward without reward_key)
    fail the step in both modes: there is nothing to set aside and nothing to count.

    With `defer_rules` and `on_invalid: fail`, a step whose values all pass returns while
    its row and cross-row rules are still checked on a thread: the caller plans the step
    meanwhile and calls `SampleTable.settle` before anything is written."""
    loaded = load_step(step, sources)
    original = loaded.frame.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias(ROW_ID))
    type_errors = loaded.type_errors
    if type_errors is None:
        type_errors = pl.repeat(None, original.height, dtype=pl.String, eager=True)
    frame = original.with_columns(type_errors.alias(TYPE_ERROR))
    repaired = {CLEARED: 0, STAMPED: 0}
    if settings.rollout_id_policy == "repair":
        frame, repaired = repair_rollout_ids(frame)
    quarantining = settings.on_invalid == "quarantine"
    verdict = validate_step(
        frame,
        loaded.type_violations,
        step,
        settings.reward_key,
        settings.normalizes_rewards,
        until_valid=quarantining,
        defer_rules=defer_rules,
    )
    if verdict.violations and not (quarantining and verdict.settled):
        raise StepError(verdict.violations)
    quarantine = None
    if verdict.violations:
        quarantine = quarantine_table(original, verdict.failing)
    return SampleTable(
        step=step,
        frame=verdict.valid.drop(ROW_ID, TYPE_ERROR),
        files=loaded.files,
        digests=loaded.digests,
        ignored_columns=loaded.ignored_columns,
        ingested=loaded.frame.height,
        repaired=repaired,
        quarantine=quarantine,
        light=verdict.light,
        pending_rules=verdict.pending,
    )


# A step's files of at least this size take several times the plan's imports to decode.
PATIENT_IMPORT_BYTES = 64 << 20


def _import_the_plan(patient: bool) -> None:
    if patient:
        readers.core_free.wait()
    importlib.import_module("pipeline.step.write")


@contextmanager
def importing_the_plan(sources: Sequence[SourceFile]) -> Iterator[None]:
    """Import the plan's and the write's modules (without numpy, which only the rollout-side
    schedule and balance_data load: 0.02-0.05 s here once Polars is loaded, 0.05-0.12 s
    when they imported numpy), on a thread while the block reads
    and validates `sources`: Polars decodes and validates without the GIL. The CLI and
    the Pipes worker import them no sooner, so a build's imports overlap its read.

    For a large step the thread first waits until the read leaves a core free
    (`readers.core_free`): beside both decoders it would slow the longest of them, the
    read's critical path. 32k samples (149 MiB): 0.941x and 0.958x the build's time
    (faster in 20 and 15 of 24 rounds), compact 0.969x. A small step's read is over before
    the imports would be, so they start at once: 8k samples (38 MiB) took 1.013x the time
    waiting (docs/performance.md)."""
    patient = sum(_size(source.path) for source in sources) >= PATIENT_IMPORT_BYTES
    thread = threading.Thread(target=_import_the_plan, args=(patient,))
    thread.start()
    try:
        yield
    finally:
        readers.core_free.set()  # a read that failed frees the thread too
        thread.join()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # the read names what is wrong with the file
        return 0

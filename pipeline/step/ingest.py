"""Ingest one step: read its files, type them, repair legacy ids if asked, validate.

The `rollout_samples` asset and `rollout-shards validate` stop here; `plan` takes over.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import polars as pl

from pipeline import columns as c
from pipeline import trainers
from pipeline.columns import PATH_STEP, REASON, ROW_ID, TYPE_ERROR
from pipeline.errors import StepError, Violation
from pipeline.io.discovery import SourceFile
from pipeline.io.load import load_step
from pipeline.io.step_files import LoadedStep
from pipeline.schemas.rules import TABLE, Model
from pipeline.schemas.validate import Verdict, validate_step
from pipeline.settings import RowSettings, Settings
from pipeline.speed import EarlyDigests
from pipeline.step.tables import SampleTable
from pipeline.trainers import Profile
from pipeline.transforms.repair import CLEARED, STAMPED, repair_rollout_ids
from pipeline.transforms.reward_groups import every_row_grouped, kept_whole

PROVENANCE = (c.SOURCE_FILE, c.SOURCE_ROW, PATH_STEP)
# Provenance as the quarantine table names it: where to find the row as it was written.
QUARANTINE_PROVENANCE = {c.SOURCE_FILE: "source_file", c.SOURCE_ROW: "source_row"}
SIBLING = "sibling of an invalid leaf: "


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


def repair_and_validate(
    frame: pl.DataFrame,
    type_violations: list[Violation],
    step: int,
    settings: Settings | RowSettings,
    table: Model = TABLE,
) -> tuple[Verdict, dict[str, int]]:
    """Repair legacy ids if the settings ask, then validate (until valid when quarantining);
    the verdict and the repaired counts. `table`: the column tests to run (the rank-bounded
    build tests its lists apart, `TABLE_ROWS`)."""
    repaired = {CLEARED: 0, STAMPED: 0}
    if settings.rollout_id_policy == "repair":
        frame, repaired = repair_rollout_ids(frame)
    profile = trainers.profile(settings.trainer)
    verdict = validate_step(
        frame,
        type_violations,
        step,
        settings.reward_key,
        settings.normalizes_rewards and profile.sibling_rewards,
        until_valid=settings.on_invalid == "quarantine",
        table=table,
        row_rules=profile.row_rules,
    )
    # the batch settings say how rewards are grouped (`validate` of the rows alone has none)
    if isinstance(settings, Settings) and settings.on_invalid == "quarantine" and verdict.settled:
        verdict = _groups_kept_whole(frame, verdict, step, settings, profile)
    return _without_set_aside(verdict, step, settings, profile), repaired


def _groups_kept_whole(
    frame: pl.DataFrame, verdict: Verdict, step: int, settings: Settings, profile: Profile
) -> Verdict:
    """The reward groups (as ingested) of the rows quarantine sets aside go aside whole, so
    no remaining row is normalized against a group that lost rows
    (`transforms.reward_groups`); a whole-batch group refuses the step."""
    if verdict.failing.is_empty():
        return verdict
    groups = profile.reward_groups(settings, frame.height, every_row_grouped(frame))
    mates = kept_whole(frame, verdict.failing, groups, step)
    if mates.is_empty():
        return verdict
    ids = mates.get_column(ROW_ID).implode()
    return dataclasses.replace(
        verdict,
        valid=verdict.valid.filter(~pl.col(ROW_ID).is_in(ids)),
        failing=pl.concat([verdict.failing, mates], how="vertical_relaxed"),
        light=None,  # positions moved: the plan computes them again
    )


def _without_set_aside(
    verdict: Verdict, step: int, settings: Settings | RowSettings, profile: Profile
) -> Verdict:
    """The rows the trainer's own filter sets aside (`Profile.set_aside`: miles' weight-
    staleness budget) leave the valid rows for the quarantine, whatever on_invalid says
    (the trainer's filter, not invalid data)."""
    stale = profile.set_aside(verdict.valid, settings, step)
    if stale is None or stale.is_empty():
        return verdict
    ids = stale.get_column(ROW_ID).implode()
    return dataclasses.replace(
        verdict,
        valid=verdict.valid.filter(~pl.col(ROW_ID).is_in(ids)),
        failing=pl.concat([verdict.failing, stale], how="vertical_relaxed"),
        light=None,  # positions moved: the plan computes them again
    )


def load_samples(
    step: int,
    sources: Sequence[SourceFile],
    settings: Settings | RowSettings,
    early: EarlyDigests | None = None,
) -> SampleTable:
    """Read a step whole (`load_step`; `early` gives digests of the files taken before the
    read) and check it (`checked`)."""
    return checked(load_step(step, sources, early), settings)


def checked(loaded: LoadedStep, settings: Settings | RowSettings) -> SampleTable:
    """Repair legacy ids if asked, validate. With `on_invalid: fail` any broken rule fails
    the step; with `quarantine` the trajectories holding a failing row are set aside whole
    and the rest goes on. Problems that name no rows (an unreadable file, a missing column,
    a column of an impossible type, a struct reward without reward_key) fail the step in
    both modes: there is nothing to set aside and nothing to count."""
    step = loaded.step
    original = loaded.frame.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias(ROW_ID))
    type_errors = loaded.type_errors
    if type_errors is None:
        type_errors = pl.repeat(None, original.height, dtype=pl.String, eager=True)
    frame = original.with_columns(type_errors.alias(TYPE_ERROR))
    verdict, repaired = repair_and_validate(frame, loaded.type_violations, step, settings)
    quarantining = settings.on_invalid == "quarantine"
    if verdict.violations and not (quarantining and verdict.settled):
        raise StepError(verdict.violations)
    quarantine = None
    if not verdict.failing.is_empty():  # invalid trajectories, or stale groups
        quarantine = quarantine_table(original, verdict.failing)
    return SampleTable(
        step=step,
        frame=verdict.valid.drop(ROW_ID, TYPE_ERROR),
        files=loaded.files,
        ignored_columns=loaded.ignored_columns,
        ingested=loaded.frame.height,
        repaired=repaired,
        quarantine=quarantine,
        light=verdict.light,
    )

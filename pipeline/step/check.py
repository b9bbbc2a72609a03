"""THE check of a step's rows, whoever read them: type, repair, validate, quarantine.

Every reader (`step.readers`: in memory, in parts with a spill, Ray shares) hands `check` a
`ReadStep`: the step's rows typed by `StepFiles.add_rows` (the one typing, through
`typed_part` for a read in parts) and where their per-token lists are. A reader in memory
leaves the lists in the rows; the others put each list's shape in its place (an empty
list, or null where the list is null) beside the per-row scalars reduced from it
(`samples.reduced_lists`), and keep the values elsewhere (`Lists`: a spill, the input
files). The contract's tests of a list are of its type and its nulls, which its shape
keeps, and every rule that reads a list reads its reductions: so one validation, on the
same rows, gives every reader the same lines, counts and quarantine. Only the trajectories
a quarantine sets aside take their lists back from the reader.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import polars as pl

from pipeline import columns as c
from pipeline import trainers
from pipeline.columns import PATH_STEP, REASON, ROW_ID, TYPE_ERROR
from pipeline.errors import StepError, Violation
from pipeline.io.discovery import SourceFile
from pipeline.io.step_files import LoadedStep, StepFiles
from pipeline.schemas.rules import TABLE
from pipeline.schemas.validate import QUARANTINE_HINT, Verdict, validate_step
from pipeline.settings import RowSettings, Settings
from pipeline.step.tables import SampleTable
from pipeline.trainers import Profile
from pipeline.transforms import samples as s
from pipeline.transforms.repair import CLEARED, STAMPED, repair_rollout_ids
from pipeline.transforms.reward_groups import every_row_grouped, kept_whole

PROVENANCE = (c.SOURCE_FILE, c.SOURCE_ROW, PATH_STEP)
# Provenance as the quarantine table names it: where to find the row as it was written.
QUARANTINE_PROVENANCE = {c.SOURCE_FILE: "source_file", c.SOURCE_ROW: "source_row"}
SIBLING = "sibling of an invalid leaf: "
# The columns a read in parts adds in place of a list's values.
REDUCED = frozenset(s.list_reductions(pl.Schema())) | {c.has_column(n) for n in c.PER_TOKEN_COLUMNS}

# What makes a list's shape enough: the contract tests a list's type and nulls only.
assert all(
    rule.isin is None and rule.ge is None
    for name, rule in TABLE.columns.items()
    if name in c.PER_TOKEN_COLUMNS
), "a per-token list's test reads its values: a read in parts must test them as it reads"


class Lists(Protocol):
    """Where a read in parts keeps the step's per-token lists."""

    def take(self, rows: pl.Series) -> list[pl.Series]:
        """The lists of the rows at these loaded positions (ascending), in that order, typed
        as the read typed them: one Series per list column of the step."""
        ...

    def keep(self, rows: pl.Series) -> None:
        """The loaded position of each row the batch keeps, in batch order (the rows the
        plan sees): where the writer finds each batch row's lists."""
        ...


@dataclass
class ReadStep:
    """What a reader hands the check: the step's typed rows and where their lists are
    (None: in the rows)."""

    loaded: LoadedStep
    lists: Lists | None = None


def typed_part(
    files: StepFiles, source: SourceFile, frame: pl.DataFrame, first: int
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """A part of a file (rows `first`.. as stored) typed as the whole read types it, then
    split: its rows with each list's shape in place and the list's reductions appended,
    and its lists (the values a reader in parts keeps aside)."""
    return split_lists(files.add_rows(source, frame, first))


def split_lists(typed: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Typed rows split as `typed_part` splits them: the rows with each list's shape and
    reductions, and the lists."""
    names = [name for name in c.PER_TOKEN_COLUMNS if name in typed.columns]
    shapes = typed.with_columns(pl.col(name).list.head(0) for name in names)
    return shapes.hstack(s.reduced_lists(typed)), typed.select(names)


def check(read: ReadStep, settings: Settings | RowSettings) -> SampleTable:
    """Repair legacy ids if asked, validate. With `on_invalid: fail` any broken rule fails
    the step; with `quarantine` the trajectories holding a failing row are set aside whole
    and the rest goes on. Problems that name no rows (an unreadable file, a missing column,
    a column of an impossible type, a struct reward without reward_key) fail the step in
    both modes: there is nothing to set aside and nothing to count."""
    loaded = dropped(read.loaded, getattr(settings, "dropped_columns", ()))
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
    reduced = [n for n in original.columns if n in REDUCED] if read.lists is not None else []
    lists = [n for n in c.PER_TOKEN_COLUMNS if n in original.columns]
    quarantine = None
    if not verdict.failing.is_empty():  # invalid trajectories, or stale groups
        quarantine = quarantine_table(original.drop(reduced), verdict.failing)
        if read.lists is not None:
            # the rows `quarantine_table` keeps, in its order, take their lists back
            failing = verdict.failing.get_column(ROW_ID).implode()
            touched = pl.col(ROW_ID).is_in(failing).any().over(c.TRAJECTORY)
            kept = original.filter(touched).get_column(ROW_ID)
            quarantine = quarantine.with_columns(read.lists.take(kept))
    valid = verdict.valid.drop(ROW_ID, TYPE_ERROR)
    columns = None
    if read.lists is not None:
        read.lists.keep(verdict.valid.get_column(ROW_ID))
        valid = valid.drop(lists)  # shapes: the plan reads the reductions
        columns = pl.Schema(
            (n, original.schema[n]) for n in original.columns if n not in reduced and n != ROW_ID
        )
    return SampleTable(
        step=step,
        frame=valid,
        files=loaded.files,
        ignored_columns=loaded.ignored_columns,
        ingested=original.height,
        repaired=repaired,
        quarantine=quarantine,
        light=verdict.light,
        columns=columns,
    )


def dropped(loaded: LoadedStep, names: Sequence[str]) -> LoadedStep:
    """The step without the input columns its settings have the trainer ignore (miles'
    `legacy_weight_versions: drop`): as absent from every rule, the plan, the rank files
    and the metrics, and listed with the manifest's `ignored_columns`. A value of such a
    column that its type refused stays refused (`type_violations`, `type_errors`): the
    value is not read, but it is not another type's either."""
    frame = loaded.frame
    names = [name for name in names if name in frame.columns]
    if not names:
        return loaded
    without = frame.drop(names)
    # a read in parts reduced the lists already: what it reduced of a dropped column is
    # made again as of a step without it (`_has_version_strings`: false)
    again = s.list_reductions(without.schema)
    stale = [
        name
        for name, made in s.list_reductions(frame.schema).items()
        if name in frame.columns and set(made.meta.root_names()) & set(names)
    ]
    return dataclasses.replace(
        loaded,
        frame=without.with_columns(again[name].alias(name) for name in stale),
        ignored_columns=sorted({*loaded.ignored_columns, *names}),
    )


def repair_and_validate(
    frame: pl.DataFrame,
    type_violations: list[Violation],
    step: int,
    settings: Settings | RowSettings,
) -> tuple[Verdict, dict[str, int]]:
    """Repair legacy ids if the settings ask, then validate (until valid when quarantining);
    the verdict and the repaired counts."""
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
        row_rules=profile.row_rules,
    )
    # the batch settings say how rewards are grouped (`validate` of the rows alone has none)
    if isinstance(settings, Settings) and settings.on_invalid == "quarantine" and verdict.settled:
        verdict = _groups_kept_whole(frame, verdict, step, settings, profile)
    elif isinstance(settings, Settings) and verdict.violations:
        _hint_what_quarantine_would_do(frame, verdict, settings, profile)
    return _without_set_aside(verdict, step, settings, profile), repaired


def _hint_what_quarantine_would_do(
    frame: pl.DataFrame, verdict: Verdict, settings: Settings, profile: Profile
) -> None:
    """A step whose reward group is the whole batch cannot be quarantined (any row taken
    out renormalizes every other): the lines say so instead of suggesting quarantine."""
    hinted = [v for v in verdict.violations if v.message.endswith(QUARANTINE_HINT)]
    if not hinted:
        return
    groups = profile.reward_groups(settings, frame.height, every_row_grouped(frame))
    if groups.kind != "whole":
        return
    instead = (
        f"--on-invalid quarantine cannot set them aside: {groups.described} is one reward "
        "group, which any row taken out would renormalize; give every row its group_index"
    )
    for violation in hinted:
        violation.message = violation.message.removesuffix(QUARANTINE_HINT) + instead


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

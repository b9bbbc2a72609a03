"""Trainer profiles: what differs between the trainers a step is built for.

Every trainer reads the same checked rows; what it then does with them differs: how rewards
are normalized, whether and how the batch is trimmed, how rows are split across data-parallel
ranks and micro-batches, and so what each rank file holds. A profile declares exactly that,
one module per trainer in this package (`miles.py`, ...), each exposing `PROFILE`. Everything
outside this package reaches a profile through `profile(name)`, keyed by the `trainer`
setting, and never imports a trainer's module.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

# Polars is not loaded by importing the package: the command line reads a trainer's flag
# readers before it sets Polars' allocator up (`pipeline.speed`).
if TYPE_CHECKING:
    import numpy as np
    import polars as pl

    from pipeline.schemas.rules import Model
    from pipeline.transforms.layout import Layout
    from pipeline.transforms.reward_groups import RewardGroups

# The settings a profile is handed (`pipeline.settings.Settings`: the common settings and,
# by name, the trainer's own): named here, loosely typed, so that no trainer's package
# imports the settings core, which reaches the trainers through this package.
Settings = Any

# The trainers by the name the `trainer` setting takes: each a package of this one.
NAMES = ("miles", "slime", "verl")
# The default trainer, and the one a manifest written before the `trainer` setting was for.
DEFAULT = NAMES[0]


@dataclass(frozen=True)
class BatchPlan:
    """What a trainer makes of a step's valid rows: which leading rows it keeps, each kept
    row's shard scalars (`light`, batch order) and where every kept row trains (`layout`)."""

    kept: int  # rows kept from the head of the batch
    trimmed: int
    is_compact: bool  # some row has a rollout id: kept in whole rollouts
    global_batch_size: int
    dynamic_global_batch_size: int | None
    light: pl.DataFrame  # the kept rows' light and shard scalar columns, in batch order
    layout: Layout
    equal_reward_groups: int
    untrained_ranks: list[int]


class Profile(Protocol):
    """One trainer's conversion of checked rows into its ranks' training data."""

    @property
    def name(self) -> str: ...

    @property
    def row_rules(self) -> Model:
        """The rules across rows this trainer holds the rows to (rollout ids)."""

    @property
    def sibling_rewards(self) -> bool:
        """Whether a rollout's rows must share one reward when rewards are normalized."""

    @property
    def settings(self) -> frozenset[str]:
        """The settings this trainer reads besides the common ones: its settings model's
        fields (`settings_model`); any other given is refused."""

    @property
    def rank_columns(self) -> tuple[str, ...]:
        """The columns of its rank files, in order (`columns.DATASET_COLUMNS` and any of
        the light frame's own columns the trainer's loader needs besides)."""

    # `settings` is a `pipeline.settings.Settings` (which imports this package to check
    # the trainer's: named here without importing it back)
    def set_aside(self, rows: pl.DataFrame, settings: Any, step: int) -> pl.DataFrame | None:
        """The valid rows (with `columns.ROW_ID`) the trainer's own filter sets aside before
        its batch, each with a `columns.REASON` (miles' weight-staleness budget), or None;
        they go to the quarantine and count as quarantined, whatever `on_invalid` says."""

    def set_aside_stats(self, quarantine: pl.DataFrame | None, settings: Any) -> dict[str, float]:
        """The rollout metrics of what `set_aside` set aside (empty when it sets none)."""

    def set_aside_words(self, stats: dict[str, float]) -> str:
        """What `set_aside` set aside, from a manifest's `stats`, for the build's summary
        line (` (2 stale groups, 8 rows)`), or an empty text."""

    def check(self, settings: Any) -> str | None:
        """What this trainer refuses of well-typed settings (a usage error), or None."""

    def row_flops(self, lengths: np.ndarray, settings: Any) -> np.ndarray | None:
        """Each row's forward FLOPs by this trainer's estimate of the model's shape
        (`transforms.flops`) for rows of total `lengths`, or None without a shape."""

    def reward_groups(self, settings: Any, ingested: int, grouped: bool) -> RewardGroups:
        """How this trainer groups rewards for normalization, decided on the step as
        ingested: `ingested` rows, `grouped` when every one has a `group_index`
        (`transforms.reward_groups`: what quarantine and trimming must keep whole)."""

    def plan(
        self,
        light: pl.LazyFrame,
        schema: pl.Schema,
        height: int,
        settings: Any,
        step: int,
        groups: RewardGroups | None = None,
    ) -> BatchPlan:
        """The batch plan of a step's `height` valid rows: `light` holds their light columns
        (`transforms.samples.light_frame`) in batch order, `schema` the rows' columns;
        `groups` the reward groups as ingested (None: decided on these rows)."""


class NoSetAside:
    """What a profile without a filter of its own before the batch answers (miles has one:
    its weight-staleness budget)."""

    def set_aside(self, rows: pl.DataFrame, settings: Any, step: int) -> pl.DataFrame | None:
        return None

    def set_aside_words(self, stats: dict[str, float]) -> str:
        return ""

    def set_aside_stats(self, quarantine: pl.DataFrame | None, settings: Any) -> dict[str, float]:
        return {}


def profile(name: str) -> Profile:
    """The profile of the trainer `name` (one of `NAMES`)."""
    module = importlib.import_module(f"{__name__}.{_known(name)}.profile")
    found: Profile = module.PROFILE
    return found


def settings_model(name: str) -> Any:
    """The settings model of the trainer `name` (its package's `settings.MODEL`): a frozen
    dataclass of what it reads besides the common settings, with `normalizes_rewards`,
    `derived(values)` (settings it derives from the others) and `batch_stand_in(values)`
    (what lets `validate` check the rows alone, or None). Loads no Polars."""
    module = importlib.import_module(f"{__name__}.{_known(name)}.settings")
    model = module.MODEL
    return model


def flag_readers() -> dict[str, Callable[[str], Any]]:
    """The command-line readers of every trainer's settings whose value is not one scalar
    type (each package's `flags.FLAG_READERS`), by setting name. Loads no Polars."""
    readers: dict[str, Callable[[str], Any]] = {}
    for name in NAMES:
        readers |= importlib.import_module(f"{__name__}.{name}.flags").FLAG_READERS
    return readers


def _known(name: str) -> str:
    if name not in NAMES:
        raise KeyError(name)
    return name

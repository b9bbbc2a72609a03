"""slime's conversion of a step's checked rows (THUDM/slime at 624b824): what it does that
miles does not (`RolloutManager._convert_samples_to_train_data`, `_post_process_rewards`,
`_split_train_data_by_dp`).

- Rewards: normalized by position, blind to `group_index` and rollout ids
  (`trainers.slime.rewards`).
- Rollout ids: a missing id becomes the smallest integer not used yet, in batch order;
  `rollout_ids` and `rollout_mask_sums` are over these ids, not `index`.
- No trimming and no dynamic global batch size: every row is kept, and the schedule
  (`trainers.slime.schedule`), which slime always runs on the rollout side, drops the rows of
  trailing rollouts past the last whole train step of `global_batch_size` rollouts.
- Rank files: the common columns plus `source_names` (`metadata`'s `source_name`, else
  "unknown"), which the loader's `rollout_shards_loader.slime` turns into slime's dict.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import polars as pl

from pipeline import columns as c
from pipeline.errors import step_error
from pipeline.schemas.rules import Model
from pipeline.trainers import BatchPlan, NoSetAside, Settings
from pipeline.trainers.miles.settings import REQUIRED_SHAPE
from pipeline.trainers.slime.rewards import positional_rewards, reward_groups
from pipeline.trainers.slime.rules import ROW_RULES
from pipeline.trainers.slime.schedule import SlimeLayout, slime_layout
from pipeline.trainers.slime.settings import MODEL
from pipeline.transforms.flops import slime_model_shape
from pipeline.transforms.layout import rank_sizes
from pipeline.transforms.repair import filled_rollout_ids
from pipeline.transforms.reward_groups import RewardGroups
from pipeline.transforms.shard_columns import light_shard_columns, raw_reward
from pipeline.transforms.trim import is_compact

# numpy only for the rollout-side schedule and FLOPs (a plain build never loads it)
if TYPE_CHECKING:
    import numpy as np

SOURCE_NAMES = "source_names"
UNKNOWN_SOURCE = "unknown"


def source_names() -> pl.Expr:
    name = pl.col(c.SOURCE_NAME)
    return (
        pl.when(name.is_null() | (name == ""))
        .then(pl.lit(UNKNOWN_SOURCE))
        .otherwise(name)
        .alias(SOURCE_NAMES)
    )


def _layout_plan(settings: Settings) -> SlimeLayout:
    gbs = settings.global_batch_size
    assert gbs is not None, "checked with the settings"
    vpp = settings.vpp_size or 1
    group = settings.microbatch_group_size_per_vp_stage or 1
    needs_shape = settings.balance_data or settings.balance_by_flops
    return SlimeLayout(
        global_batch_size=gbs,
        dp_size=settings.dp_size,
        align=settings.dp_size * (group if vpp > 1 else 1),
        cap=(settings.max_tokens_per_gpu or 0) * (settings.cp_size or 1)
        if settings.use_dynamic_batch_size
        else None,
        micro_batch_size=settings.micro_batch_size or 1,
        balance_data=settings.balance_data or settings.balance_by_flops,
        balance_by_flops=settings.balance_by_flops,
        shape=slime_model_shape(settings) if needs_shape else None,
    )


@dataclasses.dataclass(frozen=True)
class Slime(NoSetAside):
    """The slime profile (`pipeline.trainers.Profile`)."""

    name: str = "slime"
    row_rules: Model = ROW_RULES
    # slime normalizes by position: rows of one rollout may hold different rewards
    sibling_rewards: bool = False
    settings: frozenset[str] = frozenset(f.name for f in dataclasses.fields(MODEL))
    # slime's dict carries `source_names`: after the optional columns, before step and rank
    rank_columns: tuple[str, ...] = (
        *c.SHARD_COLUMNS,
        *c.OPTIONAL_SHARD_COLUMNS,
        SOURCE_NAMES,
        *c.PARTITION_COLUMNS,
    )

    def check(self, settings: Settings) -> str | None:
        return slime_settings_problem(settings)

    def row_flops(self, lengths: np.ndarray, settings: Any) -> np.ndarray | None:
        if any(getattr(settings, name) is None for name in REQUIRED_SHAPE):
            return None
        from pipeline.transforms.flops import forward_flops, slime_model_shape  # numpy

        return forward_flops(lengths, slime_model_shape(settings))

    def reward_groups(self, settings: Settings, ingested: int, grouped: bool) -> RewardGroups:
        return reward_groups(settings, ingested)

    def plan(
        self,
        light: pl.LazyFrame,
        schema: pl.Schema,
        height: int,
        settings: Settings,
        step: int,
        groups: RewardGroups | None = None,
    ) -> BatchPlan:
        rows = light.collect()
        ids = filled_rollout_ids(rows.get_column(c.ROLLOUT_ID))
        frame = (
            light_shard_columns(rows.with_columns(ids.alias(c.ROLLOUT_KEY)).lazy())
            .with_columns(raw_reward(schema), source_names())
            .collect()
        )
        rewards, equal_groups = positional_rewards(
            frame.get_column(c.REWARD_VALUE), settings, groups
        )
        frame = frame.with_columns(rewards.alias(c.REWARDS))
        layout = slime_layout(
            frame.get_column(c.ROLLOUT_IDS).to_numpy(),
            frame.get_column(c.TOTAL_LENGTHS).cast(pl.Int64).to_numpy(),
            _layout_plan(settings),
        )
        empty = [r for r, n in enumerate(rank_sizes(layout.rank, settings.dp_size)) if not n]
        if empty:
            raise step_error(
                "not_enough_samples_for_dp_size",
                f"ranks {empty} get no rows: lower dp_size or raise global_batch_size",
                step,
            )
        assert settings.global_batch_size is not None
        return BatchPlan(
            kept=height,
            trimmed=0,
            is_compact=is_compact(light),
            global_batch_size=settings.global_batch_size,
            dynamic_global_batch_size=None,
            light=frame,
            layout=layout,
            equal_reward_groups=equal_groups,
            untrained_ranks=[],
        )


def slime_settings_problem(s: Settings) -> str | None:
    """What slime's argument parser and its start-up refuse of these settings, or None."""
    if s.rollout_batch_size is None:
        return "rollout_batch_size: required by the slime trainer (slime's --rollout-batch-size)"
    if s.global_batch_size is None:
        return "global_batch_size: required (or num_steps_per_rollout, from which slime derives it)"
    if s.num_steps_per_rollout is not None:
        per_rollout = s.rollout_batch_size * (s.n_samples_per_prompt or 1)
        derived = per_rollout // s.num_steps_per_rollout
        if s.global_batch_size != derived:
            return (
                f"global_batch_size={s.global_batch_size} is not rollout_batch_size * "
                f"n_samples_per_prompt // num_steps_per_rollout = {per_rollout} // "
                f"{s.num_steps_per_rollout} = {derived} (slime asserts it): drop one of them"
            )
    if s.global_batch_size % s.dp_size:
        return (
            f"global_batch_size={s.global_batch_size} must be divisible by dp_size={s.dp_size} "
            "(Megatron refuses it at start-up): change global_batch_size or dp_size"
        )
    if s.use_dynamic_batch_size and s.max_tokens_per_gpu is None:
        return "use_dynamic_batch_size needs max_tokens_per_gpu (slime asserts it)"
    if s.balance_by_flops and not s.use_dynamic_batch_size:
        return "balance_by_flops needs use_dynamic_batch_size (slime asserts it)"
    if (s.vpp_size or 1) > 1 and s.microbatch_group_size_per_vp_stage is None:
        return "vpp_size > 1 needs microbatch_group_size_per_vp_stage"
    if s.balance_data or s.balance_by_flops:
        missing = [name for name in REQUIRED_SHAPE if getattr(s, name) is None]
        if missing:
            return (
                "balance_data and balance_by_flops weigh rows by slime's FLOPs estimate, "
                f"which needs the model's shape: set {', '.join(missing)}"
            )
    return None


PROFILE = Slime()

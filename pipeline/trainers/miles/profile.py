"""miles' conversion of a step's checked rows (radixark/miles at HEAD): what it does that
another trainer does not.

- Rewards: normalized per prompt group (`group_index`, else a fixed fan-out, else one group)
  and per rollout, in float32, divided by the group std for grpo and gspo (SEMANTICS 5).
- Trimming: trailing rows cut to whole global batches, or one optimizer step per rollout
  step with the dynamic global batch size; compact batches (v2 multi-leaf rollout ids) are
  never trimmed by row count (SEMANTICS 3).
- The DP split: strided or token-balanced ranks, or with `cp_size` the rollout-side
  schedule of whole rollouts and micro-batches (SEMANTICS 6 and 7); layouts on which
  Megatron would train nothing, hang or assert are refused (SEMANTICS 6.1).
- Rank files: `columns.DATASET_COLUMNS`, which the loader turns into miles' rank dict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import polars as pl

from pipeline import columns as c
from pipeline.errors import StepError, Violation, step_error
from pipeline.schemas.rules import ROWS, Model
from pipeline.trainers import BatchPlan, Settings
from pipeline.trainers.miles.rewards import group_normalized
from pipeline.trainers.miles.settings import MODEL, REQUIRED_SHAPE, USER_CODE
from pipeline.trainers.miles.split import plain_layout
from pipeline.trainers.miles.staleness import (
    STALE_GROUPS,
    STALE_ROWS,
    set_aside_metrics,
    stale_rows,
)
from pipeline.transforms.layout import Layout, rank_sizes, rows_within_ranks
from pipeline.transforms.reward_groups import (
    RewardGroups,
    group_key,
    largest_uncut,
    trim_cuts_group,
)
from pipeline.transforms.shard_columns import light_shard_columns, raw_reward
from pipeline.transforms.trim import is_compact

# numpy only for the rollout-side schedule and FLOPs (a plain build never loads it)
if TYPE_CHECKING:
    import numpy as np

ROWS_NAMED = 10
AVOID_UNTRAINED = (
    "set cp_size (with micro_batch_size or use_dynamic_batch_size) for the rollout-side "
    "schedule, or keep trimming on (drop disable_rollout_trim_samples)"
)


@dataclasses.dataclass(frozen=True)
class TrimPlan:
    global_batch_size: int
    dynamic_global_batch_size: int | None
    kept: int  # rows kept from the head of the batch
    trimmed: int


def dynamic_global_batch_size(n_rows: int, dp_size: int) -> int:
    """One optimizer step per rollout step: the largest multiple of dp_size, at least dp_size."""
    return max(n_rows // dp_size * dp_size, dp_size)


def plan_trim(
    n_rows: int,
    settings: Settings,
    compact: bool,
    step: int,
    uncut: Callable[[int], int],
) -> TrimPlan:
    """How many leading rows form whole optimizer batches; refuse what cannot train.
    `uncut(multiple)`: the largest global batch size, a multiple of it, whose trim cuts no
    reward group (the advice of a refusal)."""
    dynamic = None
    size = settings.global_batch_size
    assert size is not None, "checked with the settings"
    if settings.use_dynamic_global_batch_size:
        if compact:
            raise step_error(
                "dynamic_global_batch_size_on_compact",
                "use_dynamic_global_batch_size cannot apply to a compact batch (v2 multi-leaf "
                "rollout ids present): turn it off or drop the rollout ids",
                step,
            )
        dynamic = size = dynamic_global_batch_size(n_rows, settings.dp_size)
    if compact or settings.disable_rollout_trim_samples:
        return TrimPlan(size, dynamic, n_rows, 0)
    kept = n_rows // size * size
    if kept == 0:
        raise step_error(
            "not_enough_samples",
            f"not enough samples {n_rows} for global_batch_size {size}"
            f"{_fits(n_rows, settings, uncut)}",
            step,
        )
    return TrimPlan(size, dynamic, kept, n_rows - kept)


def _fits(n_rows: int, settings: Settings, uncut: Callable[[int], int]) -> str:
    """The largest global batch size this step fills (a multiple of dp_size) whose trim
    cuts no reward group, as advice."""
    dp = settings.dp_size
    if n_rows == 0:
        return ""  # nothing to fill: what emptied the step is said beside
    if n_rows < dp:
        return f"; the step has fewer rows than dp_size {dp}"
    largest = uncut(dp)
    if largest == 0:
        return (
            f"; no multiple of dp_size {dp} up to {n_rows} rows ends on a reward group's "
            "edge: give every row its group_index, or set disable_rollout_trim_samples"
        )
    return (
        f"; --global-batch-size {largest} is the largest this step fills (a multiple of "
        f"dp_size {dp} whose trim cuts no reward group)"
    )


def reward_groups(settings: Settings, ingested: int, grouped: bool) -> RewardGroups:
    """miles' prompt groups (SEMANTICS 5.3) as the step was ingested: group_index when every
    row has one, else runs of n_samples_per_prompt when the batch is rollout_batch_size x
    n_samples_per_prompt rows, else one group of the whole batch."""
    if not settings.normalizes_rewards:
        return RewardGroups("none", "rewards not normalized")
    if grouped:
        return RewardGroups("group_index", "the rows sharing its group_index")
    n, rbs = settings.n_samples_per_prompt, settings.rollout_batch_size
    if n is not None and rbs is not None and ingested == n * rbs:
        return RewardGroups(
            "positional",
            f"without group_index, runs of n_samples_per_prompt={n} rows of a batch of "
            f"rollout_batch_size x n_samples_per_prompt = {ingested} rows",
            width=n,
        )
    return RewardGroups(
        "whole",
        f"without group_index, a batch of {ingested} rows that is not rollout_batch_size x "
        "n_samples_per_prompt rows",
    )


def all_grouped(light: pl.LazyFrame) -> bool:
    """Whether every row has a group_index."""
    return bool(light.select(pl.col(c.GROUP_INDEX).is_not_null().all()).collect().item())


def with_rewards(
    light: pl.LazyFrame, groups: RewardGroups, settings: Settings
) -> tuple[pl.LazyFrame, int]:
    """`rewards` (float64 of the float32 result) per row, and the count of equal-reward groups."""
    if groups.kind == "none":
        return light.with_columns(pl.col(c.REWARD_VALUE).alias(c.REWARDS)), 0
    use_std = (
        settings.advantage_estimator in ("grpo", "gspo")
        and settings.grpo_std_normalization
        and settings.n_samples_per_prompt != 1
    )
    return group_normalized(light, group_key(groups), use_std)


def batch_layout(light: pl.DataFrame, settings: Settings) -> Layout:
    """The rollout-side schedule when cp_size is set, miles splits on the rollout side
    (not delay_split_train_data_by_dp, nor the trainer's fault tolerance) and there are
    enough rollouts (`can_schedule_on_rollout_side`), else plain; by FLOPs with
    balance_by_flops (SEMANTICS 7.7)."""
    keys = light.get_column(c.ROLLOUT_IDS)
    lengths = light.get_column(c.TOTAL_LENGTHS).cast(pl.Int64)
    assert settings.global_batch_size is not None, "checked with the settings"
    scheduled = settings.uses_schedule and not settings.splits_on_trainer
    if scheduled and keys.n_unique() >= settings.global_batch_size:
        from pipeline.trainers.miles.schedule import rollout_schedule
        from pipeline.transforms.flops import forward_flops, miles_model_shape  # numpy

        flops = None
        if settings.balance_by_flops:
            flops = forward_flops(lengths.to_numpy(), miles_model_shape(settings))
        return rollout_schedule(keys.to_numpy(), lengths.to_numpy(), settings, flops)
    return plain_layout(keys, lengths, settings)


def _check_every_rank_has_rows(ranks: pl.Series, dp_size: int, step: int) -> None:
    """A rank without rows would get an empty shard file: the settings ask for more ranks
    than the step has rows to give."""
    filled = ranks.n_unique()
    if filled < dp_size:
        raise step_error(
            "not_enough_samples_for_dp_size",
            f"dp_size {dp_size} is larger than the step can fill: {len(ranks)} rows "
            f"written reach only {filled} rank(s), so rank files would be empty; "
            "lower dp_size or raise global_batch_size",
            step,
        )


def _refusal(
    light: pl.DataFrame, positions: pl.Series, rule: str, step: int, message: str
) -> StepError:
    """A step refused by `rule`, naming the (index, leaf) of the first rows at `positions`
    of the batch."""
    shown = light[positions.head(ROWS_NAMED)]
    rows = list(
        zip(
            shown.get_column(c.SAMPLE_INDICES).to_list(),
            shown.get_column(c.LEAF).to_list(),
            strict=True,
        )
    )
    return StepError([Violation(rule, message, step=step, rows=rows, n_rows=len(positions))])


def _refuse_what_cannot_train(
    light: pl.DataFrame, layout: Layout, settings: Settings, step: int
) -> list[int]:
    """SEMANTICS 6.1: refuse a layout on which the trainer would train nothing (no whole
    optimizer step), hang (ranks running different numbers of steps) or crash (untrained
    rows under use_dynamic_batch_size); return the ranks holding rows it never trains."""
    ranks = layout.rank.gather(layout.untrained).unique().sort().to_list()
    assert settings.global_batch_size is not None, "checked with the settings"
    local = settings.global_batch_size // settings.dp_size
    sizes = rank_sizes(layout.rank, settings.dp_size)
    if not layout.num_rollouts:
        raise _refusal(
            light,
            layout.order.gather(layout.untrained),
            "no_train_steps",
            step,
            f"the trainer would run 0 optimizer steps on this step: its {len(layout.order)} "
            f"rows fill no rank's first step of global_batch_size={settings.global_batch_size}"
            f" // dp_size={settings.dp_size} = {local} rows per rank (rank sizes {sizes}); "
            "lower global_batch_size, or set cp_size for the rollout-side schedule",
        )
    if len(set(layout.steps_per_rank)) > 1:
        # the rows past the fewest steps any rank runs: where the ranks part ways
        local_row = rows_within_ranks(layout.rank, settings.dp_size)
        excess = (local_row >= min(layout.steps_per_rank) * local).arg_true()
        excess_ranks = layout.rank.gather(excess).unique().sort().to_list()
        raise _refusal(
            light,
            layout.order.gather(excess),
            "ranks_run_different_steps",
            step,
            f"ranks would run different numbers of optimizer steps "
            f"{layout.steps_per_rank} (rank sizes {sizes}, global_batch_size="
            f"{settings.global_batch_size} // dp_size={settings.dp_size} = {local} rows per "
            f"step and rank), so the trainer's collectives would hang on the "
            f"{len(excess)} rows on ranks {excess_ranks} past step "
            f"{min(layout.steps_per_rank)}: {AVOID_UNTRAINED}, "
            "or change global_batch_size or dp_size",
        )
    if len(layout.untrained) and settings.use_dynamic_batch_size:
        raise _refusal(
            light,
            layout.order.gather(layout.untrained),
            "untrained_rows_with_dynamic_batch_size",
            step,
            f"{len(layout.untrained)} rows on ranks {ranks} fall past the last whole step of "
            f"{local} rows per rank, and with use_dynamic_batch_size the trainer asserts that "
            f"its micro-batches cover every row: {AVOID_UNTRAINED}, "
            "or turn off use_dynamic_batch_size",
        )
    return [int(rank) for rank in ranks]


def batch_inconsistency(s: Settings) -> str | None:
    """What miles (and Megatron at its start-up) refuses of the batch settings: the
    data-parallel layout and the micro-batch schedule."""
    if s.global_batch_size is None:
        return (
            "global_batch_size: required by the miles trainer (miles' --global-batch-size): "
            "give --global-batch-size, or global_batch_size in --config or in the input "
            "root's rollout-shards.yaml"
        )
    if s.global_batch_size % s.dp_size:
        return (
            f"global_batch_size={s.global_batch_size} must be divisible by "
            f"dp_size={s.dp_size} (Megatron refuses it at start-up, and ranks would run "
            "different numbers of steps): change global_batch_size or dp_size"
        )
    if s.use_dynamic_batch_size and s.max_tokens_per_gpu is None:
        return "use_dynamic_batch_size needs max_tokens_per_gpu"
    if s.cp_size is not None and not s.use_dynamic_batch_size and s.micro_batch_size is None:
        return (
            "cp_size turns on the rollout-side schedule: set micro_batch_size "
            "or use_dynamic_batch_size with max_tokens_per_gpu"
        )
    if (s.vpp_size or 1) > 1 and s.microbatch_group_size_per_vp_stage is None:
        return "vpp_size > 1 needs microbatch_group_size_per_vp_stage"
    return None


def miles_flag_problem(s: Settings) -> str | None:
    """What makes these flags impossible beside the others, or None (a usage error)."""
    for name in USER_CODE:
        if getattr(s, name) is not None:
            return (
                f"{name} runs a user's Python function on miles' Sample objects, which "
                "rollout-shards does not run: convert such batches in miles, or drop the flag"
            )
    if s.multi_lora_n_adapters:
        return (
            "multi_lora_n_adapters > 0 trains adapters per sample, and the contract has no "
            "adapter column: convert multi-LoRA batches in miles"
        )
    if s.balance_by_flops:
        if not s.use_dynamic_batch_size:
            return "balance_by_flops needs use_dynamic_batch_size (as in miles)"
        missing = [name for name in REQUIRED_SHAPE if getattr(s, name) is None]
        if missing:
            return f"balance_by_flops needs the model's shape: set {', '.join(missing)}"
    if s.kv_channels is None and s.hidden_size and s.num_attention_heads:
        if s.hidden_size % s.num_attention_heads:
            return (
                f"hidden_size={s.hidden_size} is not divisible by num_attention_heads="
                f"{s.num_attention_heads}: set kv_channels (Megatron refuses it otherwise)"
            )
    pattern = s.moe_layer_freq
    if isinstance(pattern, list) and s.num_layers is not None and len(pattern) != s.num_layers:
        return (
            f"moe_layer_freq lists {len(pattern)} layers but num_layers={s.num_layers} "
            "(Megatron builds one layer per entry)"
        )
    return _steps_per_rollout_problem(s)


def _steps_per_rollout_problem(s: Settings) -> str | None:
    if s.num_steps_per_rollout is None:
        return None
    if s.rollout_batch_size is None:
        return "num_steps_per_rollout needs rollout_batch_size (miles derives the batch from it)"
    per_rollout = s.rollout_batch_size * (s.n_samples_per_prompt or 1)
    derived = per_rollout // s.num_steps_per_rollout
    if derived < 1:
        return (
            f"num_steps_per_rollout={s.num_steps_per_rollout} leaves no sample per step of "
            f"rollout_batch_size * n_samples_per_prompt = {per_rollout}"
        )
    if s.global_batch_size is not None and s.global_batch_size != derived:
        return (
            f"global_batch_size={s.global_batch_size} is not rollout_batch_size * "
            f"n_samples_per_prompt // num_steps_per_rollout = {per_rollout} // "
            f"{s.num_steps_per_rollout} = {derived} (miles refuses it): drop one of them"
        )
    return None


@dataclasses.dataclass(frozen=True)
class Miles:
    """The miles profile (`pipeline.trainers.Profile`)."""

    name: str = "miles"
    row_rules: Model = ROWS
    sibling_rewards: bool = True
    # every setting of the model that no other trainer owns is miles' (the model was made
    # for it)
    settings: frozenset[str] = frozenset(f.name for f in dataclasses.fields(MODEL))
    rank_columns: tuple[str, ...] = c.DATASET_COLUMNS

    def set_aside(self, rows: pl.DataFrame, settings: Any, step: int) -> pl.DataFrame | None:
        """miles' weight-staleness budget: the groups its buffer filter drops."""
        budget = getattr(settings, "max_weight_staleness", None)
        return None if budget is None else stale_rows(rows, step, budget)

    def set_aside_words(self, stats: dict[str, float]) -> str:
        """With max_weight_staleness, the groups and rows of `quarantined` it set aside."""
        if STALE_GROUPS not in stats:
            return ""
        groups, rows = int(stats[STALE_GROUPS]), int(stats[STALE_ROWS])
        return f" ({_count(groups, 'stale group')}, {_count(rows, 'row')})"

    def set_aside_stats(self, quarantine: pl.DataFrame | None, settings: Any) -> dict[str, float]:
        if settings.max_weight_staleness is None:
            return {}
        return set_aside_metrics(quarantine, c.GROUP_INDEX)

    def check(self, settings: Settings) -> str | None:
        if settings.advantage_estimator == "cispo":
            return "advantage_estimator: cispo is slime's estimator, not miles' (--trainer slime)"
        if settings.use_dynamic_global_batch_size and settings.disable_rollout_trim_samples:
            return "use_dynamic_global_batch_size needs trimming: drop disable_rollout_trim_samples"
        return batch_inconsistency(settings) or miles_flag_problem(settings)

    def row_flops(self, lengths: np.ndarray, settings: Any) -> np.ndarray | None:
        if any(getattr(settings, name) is None for name in REQUIRED_SHAPE):
            return None
        from pipeline.transforms.flops import forward_flops, miles_model_shape  # numpy

        return forward_flops(lengths, miles_model_shape(settings))

    def reward_groups(self, settings: Settings, ingested: int, grouped: bool) -> RewardGroups:
        return reward_groups(settings, ingested, grouped)

    def plan(
        self,
        light: pl.LazyFrame,
        schema: pl.Schema,
        height: int,
        settings: Settings,
        step: int,
        groups: RewardGroups | None = None,
    ) -> BatchPlan:
        compact = is_compact(light)
        if groups is None:
            groups = reward_groups(settings, height, all_grouped(light))
        chosen = groups

        def uncut(multiple: int) -> int:
            return largest_uncut(light, chosen, height, multiple)

        trim = plan_trim(height, settings, compact, step, uncut)
        if trim.trimmed:
            trim_cuts_group(
                light.head(trim.kept), light.slice(trim.kept), groups, step, uncut(settings.dp_size)
            )
        kept = light_shard_columns(light.head(trim.kept)).with_columns(raw_reward(schema))
        kept, equal_groups = with_rewards(kept, groups, settings)
        frame = kept.collect()
        effective = settings.replace(global_batch_size=trim.global_batch_size)
        layout = batch_layout(frame, effective)
        _check_every_rank_has_rows(layout.rank, settings.dp_size, step)
        untrained_ranks = _refuse_what_cannot_train(frame, layout, effective, step)
        return BatchPlan(
            kept=trim.kept,
            trimmed=trim.trimmed,
            is_compact=compact,
            global_batch_size=trim.global_batch_size,
            dynamic_global_batch_size=trim.dynamic_global_batch_size,
            light=frame,
            layout=layout,
            equal_reward_groups=equal_groups,
            untrained_ranks=untrained_ranks,
        )


PROFILE = Miles()


def _count(number: int, thing: str) -> str:
    return f"{number} {thing}" + ("" if number == 1 else "s")

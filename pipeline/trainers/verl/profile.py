"""verl 0.9.1's conversion of a step's checked rows: what its legacy trainer
(`RayPPOTrainer.fit`, `trainer.use_v1=false`) makes of one step's rollouts before it hands
each data-parallel rank its `DataProto.chunk` (docs/verl.md).

- The batch: `train_batch_size` prompt groups of exactly `rollout_n` contiguous rows
  (verl's `repeat(n, interleave=True)`), uid = str(group_index); nothing is trimmed.
- Lengths: a prompt longer than `max_prompt_length` or a response longer than
  `max_response_length` is refused (verl's `data.truncation: error` refuses the prompt).
- The DP split (`trainers.verl.split`): `_balance_batch` when `balance_batch`, then
  `chunk(dp_size)`: rank r takes the r-th equal run of rows.
- GRPO (`trainers.verl.rewards`): each row's score against its uid group, in float32 and in
  the rows' order after balancing. The scalar advantage goes to `rewards`, the score to
  `raw_reward`.
- Rank files: `columns.DATASET_COLUMNS` and `group_index`, which the loader
  (`rollout_shards_loader.verl`) pads into verl's tensors.
- `verl_target: v1` (verl's default V1 trainer): no balancing here (V1 balances, pads and
  computes the advantages itself); the rows stay in the step's order, rank after rank, for
  `rollout_shards_loader.verl_v1` to put into TransferQueue; an empty response is refused
  (V1 holds the score at the last response token); `rewards` is GRPO in that order.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import polars as pl

from pipeline import columns as c
from pipeline.errors import StepError, Violation, step_error
from pipeline.schemas.rules import ROWS, Model
from pipeline.trainers import BatchPlan, NoSetAside, Settings
from pipeline.trainers.verl.rewards import equal_reward_groups, step_rewards
from pipeline.trainers.verl.settings import MODEL
from pipeline.trainers.verl.split import chunked_layout, row_order
from pipeline.transforms.reward_groups import RewardGroups
from pipeline.transforms.shard_columns import light_shard_columns
from pipeline.transforms.trim import is_compact

ROWS_NAMED = 10
# the trainers a verl build is for: `RayPPOTrainer` (trainer.use_v1=false) or V1
TARGETS = ("legacy", "v1")
REQUIRED = ("train_batch_size", "rollout_n", "max_prompt_length", "max_response_length")
RUN = "_run"


def _refusal(frame: pl.DataFrame, rows: pl.Series, rule: str, step: int, message: str) -> StepError:
    """The step refused by `rule`, naming the files and the (index, leaf) of the first of the
    rows at batch positions `rows`."""
    shown = frame[rows]
    return StepError(
        [
            Violation(
                rule,
                message,
                step=step,
                files=shown.get_column(c.SOURCE_FILE).unique(maintain_order=True).head(3).to_list(),
                rows=list(
                    zip(
                        shown.get_column(c.SAMPLE_INDICES).head(ROWS_NAMED).to_list(),
                        shown.get_column(c.LEAF).head(ROWS_NAMED).to_list(),
                        strict=True,
                    )
                ),
                n_rows=len(rows),
            )
        ]
    )


def _check_lengths(frame: pl.DataFrame, settings: Settings, step: int) -> None:
    """Every prompt and response within its maximum: the agent loop pads to them, and
    verl's `data.truncation: error` refuses a longer prompt."""
    prompt = pl.col(c.N_TOKENS) - pl.col(c.RESPONSE_LENGTH)
    response = pl.col(c.RESPONSE_LENGTH)
    limits = (
        (prompt, settings.max_prompt_length, "max_prompt_length", "prompts"),
        (response, settings.max_response_length, "max_response_length", "responses"),
    )
    for length, limit, rule, what in limits:
        over = frame.select(length > limit).to_series().arg_true()
        if len(over):
            longest = frame.select(length.max()).item()
            raise _refusal(
                frame,
                over,
                rule,
                step,
                f"{len(over)} {what} are longer than {rule}={limit} (the longest has "
                f"{longest} tokens); verl pads to that length and refuses longer ones: "
                f"raise {rule} to verl's data.{rule}, or leave these rows out",
            )


def _check_v1_responses(frame: pl.DataFrame, step: int) -> None:
    """Every response at least one token: V1's agent loop writes the score at the
    response's last token (`rm_scores[-1]`), which an empty response does not have."""
    empty = frame.select(pl.col(c.RESPONSE_LENGTH) == 0).to_series().arg_true()
    if len(empty):
        raise _refusal(
            frame,
            empty,
            "v1_empty_response",
            step,
            f"{len(empty)} responses are empty but scored; verl's V1 trainer holds a score "
            "at the response's last token, which an empty response lacks: leave these rows "
            "out, or build with --verl-target legacy (trainer.use_v1=false)",
        )


def _check_groups(frame: pl.DataFrame, settings: Settings, step: int) -> None:
    """`train_batch_size` prompt groups, each exactly `rollout_n` contiguous rows with one
    `group_index` (verl repeats each prompt n times, interleaved)."""
    n = settings.rollout_n
    group = pl.col(c.GROUP_INDEX)
    runs = frame.select(
        group.is_null().alias("ungrouped"),
        (group != group.shift(1)).fill_null(True).cum_sum().alias(RUN),
        group,
    ).with_columns(
        pl.len().over(RUN).alias("run_rows"),
        pl.col(RUN).n_unique().over(c.GROUP_INDEX).alias("runs"),
    )
    ungrouped = runs.get_column("ungrouped").arg_true()
    if len(ungrouped):
        raise _refusal(
            frame,
            ungrouped,
            "group_of_rollout_n",
            step,
            f"{len(ungrouped)} rows have no group_index; verl groups a prompt's rollout_n={n} "
            "responses by it (their uid): set group_index on every row",
        )
    broken = runs.select((pl.col("run_rows") != n) | (pl.col("runs") > 1)).to_series()
    if broken.any():
        raise _refusal(
            frame,
            broken.arg_true(),
            "group_of_rollout_n",
            step,
            f"each prompt group must be exactly rollout_n={n} contiguous rows with one "
            "group_index (verl's responses of one prompt, repeated interleaved); these rows' "
            "groups are split or of another size",
        )
    groups = runs.get_column(RUN).n_unique()
    if groups != settings.train_batch_size:
        raise step_error(
            "train_batch_size_groups",
            f"{frame.height} rows make {groups} prompt groups of rollout_n={n}, but "
            f"train_batch_size={settings.train_batch_size} (verl's data.train_batch_size) "
            "asks for that many groups per step: build with the step's own count, or "
            "give the step that many groups",
            step,
        )


@dataclasses.dataclass(frozen=True)
class Verl(NoSetAside):
    """The verl profile (`pipeline.trainers.Profile`)."""

    name: str = "verl"
    # the contract's rollout-id rule; each row is scored and normalized on its own (GRPO by
    # uid), so the rows of one rollout need not share a reward
    row_rules: Model = ROWS
    sibling_rewards: bool = False
    settings: frozenset[str] = frozenset(f.name for f in dataclasses.fields(MODEL))
    rank_columns: tuple[str, ...] = (*c.DATASET_COLUMNS, c.GROUP_INDEX)

    def check(self, settings: Settings) -> str | None:
        missing = [name for name in (*REQUIRED, "pad_token_id") if getattr(settings, name) is None]
        if missing:
            return (
                f"{', '.join(missing)}: required by the verl trainer (verl's data.*, "
                "actor_rollout_ref.rollout.n and the tokenizer's pad token id)"
            )
        if settings.verl_target not in TARGETS:
            return (
                f"verl_target: {settings.verl_target!r} is not a verl trainer; one of "
                f"{', '.join(TARGETS)} (legacy: trainer.use_v1=false; v1: verl's default)"
            )
        if settings.adv_estimator != "grpo":
            return (
                f"adv_estimator: {settings.adv_estimator!r} is not built for verl; only grpo "
                "(with use_kl_in_reward=false): the other estimators need values, log probs "
                "or a KL penalty that only a model computes"
            )
        assert settings.train_batch_size is not None and settings.rollout_n is not None
        rows = settings.train_batch_size * settings.rollout_n
        # V1 pads its batch to a multiple of the ranks itself (`_balance_batch`)
        if rows % settings.dp_size and settings.verl_target == "legacy":
            return (
                f"train_batch_size={settings.train_batch_size} * rollout_n={settings.rollout_n}"
                f" = {rows} rows do not split into dp_size={settings.dp_size} equal parts "
                "(verl's DataProto.chunk asserts it): change one of them"
            )
        return None

    def row_flops(self, lengths: np.ndarray, settings: Any) -> np.ndarray | None:
        return None  # verl balances by tokens; it has no FLOPs estimate of its own

    def reward_groups(self, settings: Settings, ingested: int, grouped: bool) -> RewardGroups:
        """GRPO by uid: verl normalizes each row against the rows sharing its group_index."""
        return RewardGroups("group_index", "the rows sharing its group_index (verl's uid)")

    def plan(
        self,
        light: pl.LazyFrame,
        schema: pl.Schema,
        height: int,
        settings: Settings,
        step: int,
        groups: RewardGroups | None = None,
    ) -> BatchPlan:
        assert settings.rollout_n is not None, "checked with the settings"
        frame = (
            light_shard_columns(light)
            .with_columns(pl.col(c.REWARD_VALUE).alias(c.RAW_REWARD))
            .collect()
        )
        _check_lengths(frame, settings, step)
        _check_groups(frame, settings, step)
        if settings.verl_target == "v1":
            _check_v1_responses(frame, step)
        balance = settings.balance_batch and settings.verl_target == "legacy"
        order = row_order(frame.get_column(c.TOTAL_LENGTHS), settings.dp_size, balance)
        rewards = step_rewards(frame, order, settings.rollout_n, settings.norm_adv_by_std_in_grpo)
        frame = frame.with_columns(rewards)
        layout = chunked_layout(order, settings.dp_size, frame.get_column(c.ROLLOUT_IDS).n_unique())
        return BatchPlan(
            kept=height,
            trimmed=0,
            is_compact=is_compact(light),
            global_batch_size=height,
            dynamic_global_batch_size=None,
            light=frame,
            layout=layout,
            equal_reward_groups=equal_reward_groups(frame),
            untrained_ranks=[],
        )


PROFILE = Verl()

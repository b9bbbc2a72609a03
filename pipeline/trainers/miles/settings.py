"""miles' settings model: what the miles trainer reads besides the common settings
(`pipeline.settings.CommonSettings`), the `own` part of `Settings` when `trainer: miles`.

The batch settings (`MilesBatch`: global batch size, trimming, the reward normalization,
the DP split and micro-batches), then the data-path flags (`MilesFlags`):
`--balance-by-flops` with the model's shape under Megatron's own flag names, the
fully-async weight-staleness budget, the flags that move miles' DP split to the trainer
(`--delay-split-train-data-by-dp`, fault tolerance of the trainer), `--num-steps-per-rollout`,
and the flags rollout-shards refuses (a user's Python, multi-LoRA adapters); last
(`MilesVersions`) whether the old string form of `weight_versions` reaches the trainer. Each is
named and typed as in `miles/utils/arguments.py` or Megatron's parser; a flag not given
is None here (`transforms.flops.miles_model_shape` applies what Megatron's parser then
puts in miles' args). docs/miles.md lists every data-path flag and what happens to it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from pipeline.setting_marks import Count, NonNegative, Positive, setting

FtComponent = Literal["rollout", "train"]


Estimator = Literal[
    "grpo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"
]
NORMALIZING_ESTIMATORS = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")


def normalizes(estimator: str, rewards_normalization: bool) -> bool:
    """Whether rewards are normalized per prompt group (miles' estimators that do)."""
    return rewards_normalization and estimator in NORMALIZING_ESTIMATORS


def _flag(description: str, default: Any = None) -> Any:
    return setting(description, default)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MilesBatch:
    """How miles makes optimizer batches of a step's rows (CONTRACT section 3)."""

    global_batch_size: Count | None = setting(
        "Samples per optimizer step (rollouts per step for compact batches).", None
    )
    use_dynamic_global_batch_size: bool = setting("One optimizer step per rollout step.", False)
    disable_rollout_trim_samples: bool = setting("Keep every sample.", False)
    advantage_estimator: Estimator = setting("Advantage estimator.", "grpo")
    rewards_normalization: bool = setting(
        "Normalize rewards per prompt group (--disable-rewards-normalization).", True
    )
    grpo_std_normalization: bool = setting(
        "Divide by the group std (--disable-grpo-std-normalization).", True
    )
    n_samples_per_prompt: Count | None = setting(
        "Fixed-fanout reward groups when `group_index` is missing.", None
    )
    rollout_batch_size: Count | None = setting(
        "Prompts per rollout step, with n_samples_per_prompt.", None
    )
    balance_data: bool = setting("Balance tokens across ranks.", False)
    micro_batch_size: Count | None = setting("Fixed micro-batch size.", None)
    use_dynamic_batch_size: bool = setting("Token-budget micro-batches.", False)
    max_tokens_per_gpu: Count | None = setting("Token budget per micro-batch and GPU.", None)
    cp_size: Count | None = setting(
        "Context parallel size; setting it turns on the rollout-side schedule.", None
    )
    vpp_size: Count | None = setting("Virtual pipeline stages (null means 1).", None)
    microbatch_group_size_per_vp_stage: Count | None = setting(
        "Micro-batch group per virtual pipeline stage.", None
    )
    allow_partial_train_step: bool = setting(
        "One smaller final train step instead of dropping trailing rollouts.", False
    )

    @property
    def normalizes_rewards(self) -> bool:
        return normalizes(self.advantage_estimator, self.rewards_normalization)

    @property
    def uses_schedule(self) -> bool:
        return self.cp_size is not None


# The model-shape flags `--balance-by-flops` reads, as miles' FLOPs model reads them: the
# dense and MoE ones (slime's FLOPs model reads these too), then multi-latent attention's.
DENSE_AND_MOE_SHAPE = (
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "kv_channels",
    "vocab_size",
    "num_experts",
    "moe_router_topk",
    "moe_ffn_hidden_size",
    "moe_layer_freq",
    "moe_shared_expert_intermediate_size",
)
MODEL_SHAPE = (
    *DENSE_AND_MOE_SHAPE,
    "q_lora_rank",
    "kv_lora_rank",
    "qk_head_dim",
    "qk_pos_emb_head_dim",
    "v_head_dim",
)
# Without a default in Megatron's parser (or one it derives from a flag we do not take).
REQUIRED_SHAPE = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "vocab_size",
    "ffn_hidden_size",
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MilesFlags:
    """The miles data-path flags of CONTRACT section 3 beyond the common settings."""

    balance_by_flops: bool = _flag(
        "Pack micro-batches and deal them to ranks by forward FLOPs (the rollout-side "
        "schedule; needs use_dynamic_batch_size and the model's shape).",
        False,
    )
    num_layers: Positive | None = _flag("Transformer layers (Megatron's --num-layers).")
    hidden_size: Positive | None = _flag("Hidden size.")
    ffn_hidden_size: Positive | None = _flag("Dense FFN hidden size.")
    num_attention_heads: Positive | None = _flag("Attention heads.")
    num_query_groups: Positive | None = _flag("Query groups (null: Megatron's 1).")
    kv_channels: Positive | None = _flag("Head dimension (null: hidden_size // heads).")
    vocab_size: Positive | None = _flag("Vocabulary size.")
    num_experts: Positive | None = _flag("Routed experts (null: a dense model).")
    moe_router_topk: Positive | None = _flag("Experts per token (null: Megatron's 2).")
    moe_ffn_hidden_size: Positive | None = _flag("Expert FFN size (null: ffn_hidden_size).")
    moe_layer_freq: Positive | list[NonNegative] | None = _flag(
        "MoE layer pattern: every N-th layer, or a list of 0 (dense) / 1 (MoE) per layer, "
        "or Megatron's ([0]+[1]*3) on the command line (null: 1)."
    )
    moe_shared_expert_intermediate_size: NonNegative | None = _flag(
        "Shared experts' total FFN size (null: none)."
    )
    q_lora_rank: Positive | None = _flag("MLA query LoRA rank (null: none).")
    kv_lora_rank: Positive | None = _flag("MLA key-value LoRA rank (null: Megatron's 32).")
    qk_head_dim: NonNegative | None = _flag("MLA QK head dim (null: Megatron's 128).")
    qk_pos_emb_head_dim: NonNegative | None = _flag("MLA QK rope dim (null: Megatron's 64).")
    v_head_dim: NonNegative | None = _flag("MLA V head dim (null: Megatron's 128).")
    max_weight_staleness: NonNegative | None = _flag(
        "Set aside prompt groups whose oldest weight version lags the step by more."
    )
    delay_split_train_data_by_dp: bool = _flag(
        "The trainer splits the batch (the plain split, never the rollout-side schedule).", False
    )
    use_fault_tolerance: bool = _flag("miles' fault tolerance (with ft_components).", False)
    ft_components: list[FtComponent] | None = _flag(
        "Fault-tolerant components; `train` delays the split to the trainer."
    )
    num_steps_per_rollout: Positive | None = _flag(
        "Optimizer steps per rollout step: global_batch_size = rollout_batch_size * "
        "n_samples_per_prompt // num_steps_per_rollout."
    )
    custom_reward_post_process_path: str | None = _flag("Refused: a user's Python.")
    custom_convert_samples_to_train_data_path: str | None = _flag("Refused: a user's Python.")
    multi_lora_n_adapters: NonNegative = _flag("Refused above 0: no adapter column.", 0)

    @property
    def splits_on_trainer(self) -> bool:
        """miles splits the batch on the trainer (`split_train_data_by_dp_raw`)."""
        train_ft = self.use_fault_tolerance and "train" in (self.ft_components or [])
        return self.delay_split_train_data_by_dp or train_ft


LegacyVersions = Literal["carry", "drop"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class MilesVersions:
    """Which miles commit's reading of the old string form of `weight_versions` the step
    follows: up to 31f1ca9 the strings are the sample's versions (`carry`); since PR #1892
    (`Sample.from_dict` at 204b0f904) they load as `legacy_weight_versions`, the sample's
    `weight_versions` is `[]`, and neither its trainer, its buffer's staleness filter nor
    its metrics see them (`drop`)."""

    legacy_weight_versions: LegacyVersions = setting(
        "The string form of weight_versions: carry (miles up to 31f1ca9) or drop (miles "
        "since PR #1892, which loads it as legacy_weight_versions and trains without it).",
        "carry",
    )

    @property
    def dropped_columns(self) -> tuple[str, ...]:
        """Input columns these settings have the trainer ignore (`RowSettings`)."""
        return ("weight_versions",) if self.legacy_weight_versions == "drop" else ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class MilesSettings(MilesVersions, MilesFlags, MilesBatch):
    """Everything the miles trainer reads besides the common settings: its batch settings,
    its data-path flags, then which commit's reading of the string weight versions it
    follows (base classes' fields come first)."""

    @staticmethod
    def derived(values: Mapping[str, Any]) -> dict[str, Any]:
        """Settings miles derives from the others given (`derived_global_batch_size`)."""
        if values.get("global_batch_size") is None and (size := derived_global_batch_size(values)):
            return {"global_batch_size": size}
        return {}

    @staticmethod
    def batch_stand_in(values: Mapping[str, Any]) -> dict[str, Any] | None:
        """Without a global batch size (given or derived) `validate` checks the rows alone:
        the stand-in that lets every other setting be checked as `build` checks it (a
        global batch of dp_size rows), or None when the batch can be checked."""
        if values.get("global_batch_size") is not None or derived_global_batch_size(values):
            return None
        dp_size = values.get("dp_size", 1)
        return {"global_batch_size": dp_size if type(dp_size) is int and dp_size >= 1 else 1}


MODEL = MilesSettings
FIELDS = tuple(f.name for f in dataclasses.fields(MilesFlags))
USER_CODE = ("custom_reward_post_process_path", "custom_convert_samples_to_train_data_path")


def derived_global_batch_size(values: Mapping[str, Any]) -> int | None:
    """The global batch size `--num-steps-per-rollout` gives (miles' `miles_validate_args`),
    or None when not set or not computable (the check above words why)."""
    steps, rollouts = values.get("num_steps_per_rollout"), values.get("rollout_batch_size")
    if type(steps) is not int or type(rollouts) is not int or steps < 1:
        return None
    fanout = values.get("n_samples_per_prompt")
    return rollouts * (fanout if type(fanout) is int else 1) // steps or None

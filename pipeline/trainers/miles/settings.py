"""The settings of miles' data path beyond the common ones, mixed into `Settings`.

`--balance-by-flops` with the model's shape under Megatron's own flag names, the
fully-async weight-staleness budget, the flags that move miles' DP split to the trainer
(`--delay-split-train-data-by-dp`, fault tolerance of the trainer), `--num-steps-per-rollout`,
and the flags rollout-shards refuses (a user's Python, multi-LoRA adapters). Each is
named and typed as in `miles/utils/arguments.py` or Megatron's parser; a flag not given
is None here (`transforms.flops.miles_model_shape` applies what Megatron's parser then
puts in miles' args). docs/miles.md lists every data-path flag and what happens to it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Annotated, Any, Literal


class Minimum:
    """The mark of a strict integer of at least `value` (never a bool, a float or a text)."""

    def __init__(self, value: int) -> None:
        self.value = value


Positive = Annotated[int, Minimum(1)]
NonNegative = Annotated[int, Minimum(0)]
FtComponent = Literal["rollout", "train"]


def _flag(description: str, default: Any = None) -> Any:
    return dataclasses.field(default=default, metadata={"description": description})


# The model-shape flags `--balance-by-flops` reads, as miles' FLOPs model reads them.
MODEL_SHAPE = (
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

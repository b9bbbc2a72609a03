"""The settings model: every setting of CONTRACT.md section 3, named as miles' flags."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pipeline.errors import UsageError

Estimator = Literal["grpo", "gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"]
NORMALIZING_ESTIMATORS = ("grpo", "gspo", "reinforce_plus_plus_baseline")


class Settings(BaseModel):
    """Effective settings of one build; shared by the CLI, the Dagster run config and tests."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    global_batch_size: int = Field(
        ge=1,
        strict=True,
        description="Samples per optimizer step (rollouts per step for compact batches).",
    )
    dp_size: int = Field(
        1, ge=1, strict=True, description="Data-parallel ranks, one shard file each."
    )
    use_dynamic_global_batch_size: bool = Field(
        False, description="One optimizer step per rollout step."
    )
    disable_rollout_trim_samples: bool = Field(False, description="Keep every sample.")
    advantage_estimator: Estimator = Field("grpo", description="Advantage estimator.")
    rewards_normalization: bool = Field(
        True, description="Normalize rewards per prompt group (--disable-rewards-normalization)."
    )
    grpo_std_normalization: bool = Field(
        True, description="Divide by the group std (--disable-grpo-std-normalization)."
    )
    reward_key: str | None = Field(None, description="Field of a struct `reward`.")
    n_samples_per_prompt: int | None = Field(
        None,
        ge=1,
        strict=True,
        description="Fixed-fanout reward groups when `group_index` is missing.",
    )
    rollout_batch_size: int | None = Field(
        None, ge=1, strict=True, description="Prompts per rollout step, with n_samples_per_prompt."
    )
    balance_data: bool = Field(False, description="Balance tokens across ranks.")
    micro_batch_size: int | None = Field(
        None, ge=1, strict=True, description="Fixed micro-batch size."
    )
    use_dynamic_batch_size: bool = Field(False, description="Token-budget micro-batches.")
    max_tokens_per_gpu: int | None = Field(
        None, ge=1, strict=True, description="Token budget per micro-batch and GPU."
    )
    cp_size: int | None = Field(
        None,
        ge=1,
        strict=True,
        description="Context parallel size; setting it turns on the rollout-side schedule.",
    )
    vpp_size: int | None = Field(
        None, ge=1, strict=True, description="Virtual pipeline stages (null means 1)."
    )
    microbatch_group_size_per_vp_stage: int | None = Field(
        None, ge=1, strict=True, description="Micro-batch group per virtual pipeline stage."
    )
    allow_partial_train_step: bool = Field(
        False, description="One smaller final train step instead of dropping trailing rollouts."
    )
    on_invalid: Literal["fail", "quarantine"] = Field(
        "fail",
        description="`fail`: write nothing for an invalid step; "
        "`quarantine`: set invalid trajectories aside.",
    )
    rollout_id_policy: Literal["strict", "repair"] = Field(
        "strict",
        description="`repair` fixes legacy rollout ids (before miles PR #2536) and counts them.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.use_dynamic_global_batch_size and self.disable_rollout_trim_samples:
            raise ValueError(
                "use_dynamic_global_batch_size needs trimming: drop disable_rollout_trim_samples"
            )
        if self.global_batch_size % self.dp_size:
            raise ValueError(
                f"global_batch_size={self.global_batch_size} must be divisible by "
                f"dp_size={self.dp_size} (Megatron refuses it at start-up, and ranks would run "
                "different numbers of steps): change global_batch_size or dp_size"
            )
        if self.use_dynamic_batch_size and self.max_tokens_per_gpu is None:
            raise ValueError("use_dynamic_batch_size needs max_tokens_per_gpu")
        if (
            self.cp_size is not None
            and not self.use_dynamic_batch_size
            and self.micro_batch_size is None
        ):
            raise ValueError(
                "cp_size turns on the rollout-side schedule: set micro_batch_size "
                "or use_dynamic_batch_size with max_tokens_per_gpu"
            )
        if (self.vpp_size or 1) > 1 and self.microbatch_group_size_per_vp_stage is None:
            raise ValueError("vpp_size > 1 needs microbatch_group_size_per_vp_stage")
        return self

    @property
    def normalizes_rewards(self) -> bool:
        return self.rewards_normalization and self.advantage_estimator in NORMALIZING_ESTIMATORS

    @property
    def uses_schedule(self) -> bool:
        return self.cp_size is not None


# Boolean settings that default to on are turned off by a miles-style --disable-* flag.
DISABLE_FLAGS = {
    "rewards_normalization": "disable_rewards_normalization",
    "grpo_std_normalization": "disable_grpo_std_normalization",
}


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"])
        msg = item["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts)


def read_config(path: str | Path | None) -> dict[str, Any]:
    """Settings from a YAML file (a mapping of setting names), or {} without one."""
    if path is None:
        return {}
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read config {path}: {exc.strerror}") from exc
    except UnicodeDecodeError:
        raise UsageError(f"config {path} is not a text (UTF-8) YAML file") from None
    import yaml  # only a step with a config file pays for the import

    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        # PyYAML's message spans lines (a caret under the spot): one line for the user.
        reason = " ".join(str(exc).split())
        raise UsageError(f"config {path} is not valid YAML: {reason}") from exc
    if not isinstance(data, dict):
        raise UsageError(f"config {path} must be a mapping of setting names to values")
    for flag, setting in ((v, k) for k, v in DISABLE_FLAGS.items()):
        if flag in data:
            data[setting] = not data.pop(flag)
    return data


def make_settings(values: dict[str, Any]) -> Settings:
    try:
        return Settings(**values)
    except ValidationError as exc:
        raise UsageError(f"invalid settings: {_describe(exc)}") from exc


# An input root may carry the settings its data was written for; they rank below
# --config and flags.
DATA_SETTINGS = "rollout-shards.yaml"


def data_settings_files(inputs: list[str | Path]) -> list[Path]:
    return [Path(p) / DATA_SETTINGS for p in inputs if (Path(p) / DATA_SETTINGS).is_file()]


def load_settings(
    config: str | Path | None = None, data_configs: Sequence[Path] = (), **overrides: Any
) -> Settings:
    """Defaults, then settings beside the data, then the YAML file, then explicit
    overrides (flags or run config)."""
    values: dict[str, Any] = {}
    for path in data_configs:
        values.update(read_config(path))
    values.update(read_config(config))
    values.update({k: v for k, v in overrides.items() if v is not None})
    return make_settings(values)

"""Run config of a build: the settings of CONTRACT section 3, typed, under their own names.

A field left unset keeps the value from the settings files (`ROLLOUT_SHARDS_CONFIG`, then
the input root's `rollout-shards.yaml`, then the defaults), so the launchpad only needs
what a run changes.
"""

from __future__ import annotations

from enum import Enum, StrEnum
from typing import Any

import dagster as dg
from pydantic import Field

from pipeline.settings import Settings


def _doc(name: str) -> str:
    return f"{Settings.model_fields[name].description} Unset: from the settings files."


class AdvantageEstimator(StrEnum):
    grpo = "grpo"
    gspo = "gspo"
    reinforce_plus_plus = "reinforce_plus_plus"
    reinforce_plus_plus_baseline = "reinforce_plus_plus_baseline"
    ppo = "ppo"


class OnInvalid(StrEnum):
    fail = "fail"
    quarantine = "quarantine"


class RolloutIdPolicy(StrEnum):
    strict = "strict"
    repair = "repair"


class BuildConfig(dg.Config):
    """Settings overrides for one run, named as miles' flags."""

    global_batch_size: int | None = Field(None, description=_doc("global_batch_size"))
    dp_size: int | None = Field(None, description=_doc("dp_size"))
    use_dynamic_global_batch_size: bool | None = Field(
        None, description=_doc("use_dynamic_global_batch_size")
    )
    disable_rollout_trim_samples: bool | None = Field(
        None, description=_doc("disable_rollout_trim_samples")
    )
    advantage_estimator: AdvantageEstimator | None = Field(
        None, description=_doc("advantage_estimator")
    )
    rewards_normalization: bool | None = Field(None, description=_doc("rewards_normalization"))
    grpo_std_normalization: bool | None = Field(None, description=_doc("grpo_std_normalization"))
    reward_key: str | None = Field(None, description=_doc("reward_key"))
    n_samples_per_prompt: int | None = Field(None, description=_doc("n_samples_per_prompt"))
    rollout_batch_size: int | None = Field(None, description=_doc("rollout_batch_size"))
    balance_data: bool | None = Field(None, description=_doc("balance_data"))
    micro_batch_size: int | None = Field(None, description=_doc("micro_batch_size"))
    use_dynamic_batch_size: bool | None = Field(None, description=_doc("use_dynamic_batch_size"))
    max_tokens_per_gpu: int | None = Field(None, description=_doc("max_tokens_per_gpu"))
    cp_size: int | None = Field(None, description=_doc("cp_size"))
    vpp_size: int | None = Field(None, description=_doc("vpp_size"))
    microbatch_group_size_per_vp_stage: int | None = Field(
        None, description=_doc("microbatch_group_size_per_vp_stage")
    )
    allow_partial_train_step: bool | None = Field(
        None, description=_doc("allow_partial_train_step")
    )
    on_invalid: OnInvalid | None = Field(None, description=_doc("on_invalid"))
    rollout_id_policy: RolloutIdPolicy | None = Field(None, description=_doc("rollout_id_policy"))

    def overrides(self) -> dict[str, Any]:
        """The settings this run sets, as plain values for `load_settings`."""
        values = {}
        for name in Settings.model_fields:
            value = getattr(self, name)
            if value is not None:
                values[name] = value.value if isinstance(value, Enum) else value
        return values

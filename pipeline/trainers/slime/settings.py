"""slime's settings model: what the slime trainer reads besides the common settings
(`pipeline.settings.CommonSettings`), the `own` part of `Settings` when `trainer: slime`.

slime's flags are miles' (both descend from the same arguments module), so each field is
miles' own field (`trainers.miles.settings.MilesSettings`): its type, default and text.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from pipeline.trainers.miles.settings import DENSE_AND_MOE_SHAPE, MilesSettings, normalizes

# The settings slime reads, named as its flags (and Megatron's for the model's shape).
READ = frozenset(
    (
        "global_batch_size",
        "rollout_batch_size",
        "n_samples_per_prompt",
        "num_steps_per_rollout",
        "dp_size",
        "cp_size",
        "vpp_size",
        "microbatch_group_size_per_vp_stage",
        "micro_batch_size",
        "use_dynamic_batch_size",
        "max_tokens_per_gpu",
        "balance_data",
        "balance_by_flops",
        "advantage_estimator",
        "rewards_normalization",
        "grpo_std_normalization",
        "reward_key",
        *DENSE_AND_MOE_SHAPE,  # slime counts multi-latent attention only under a flag
    )
)


_MILES = {f.name: f for f in dataclasses.fields(MilesSettings)}
_KINDS = typing.get_type_hints(MilesSettings, include_extras=True)


def _normalizes_rewards(self: Any) -> bool:
    return normalizes(self.advantage_estimator, self.rewards_normalization)


def _uses_schedule(self: Any) -> bool:
    return self.cp_size is not None


# miles' fields that slime reads, in miles' order (dataclasses.make_dataclass: the fields
# are miles' own, not a copy to keep in step)
SlimeSettings: type = dataclasses.make_dataclass(
    "SlimeSettings",
    [
        (name, _KINDS[name], dataclasses.field(default=f.default, metadata=f.metadata))
        for name, f in _MILES.items()
        if name in READ
    ],
    frozen=True,
    kw_only=True,
    namespace={
        "__doc__": "Everything the slime trainer reads besides the common settings.",
        "normalizes_rewards": property(_normalizes_rewards),
        "uses_schedule": property(_uses_schedule),
        "derived": staticmethod(MilesSettings.derived),
        "batch_stand_in": staticmethod(lambda values: None),
    },
)
SlimeSettings.__module__ = __name__

MODEL = SlimeSettings

"""verl's settings model, named after its configuration keys: what the verl trainer reads
besides the common settings (`pipeline.settings.CommonSettings`), the `own` part of
`Settings` when `trainer: verl` (the profile, `profile.py`, reads them; docs/verl.md maps
each to its key). Its booleans take a value on the command line, as verl's keys do."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from pipeline.setting_marks import NonNegative, Positive, setting


def _verl(description: str, default: Any) -> Any:
    return setting(description, default, valued=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerlSettings:
    """The fields verl's profile reads (`trainer: verl`)."""

    rollout_n: Positive | None = _verl(
        "verl's actor_rollout_ref.rollout.n: responses per prompt; each prompt group is "
        "exactly this many contiguous rows.",
        None,
    )
    train_batch_size: Positive | None = _verl(
        "verl's data.train_batch_size: prompt groups per step.", None
    )
    max_prompt_length: Positive | None = _verl(
        "verl's data.max_prompt_length: prompts are left-padded to it.", None
    )
    max_response_length: Positive | None = _verl(
        "verl's data.max_response_length: responses are right-padded to it.", None
    )
    adv_estimator: str = _verl("verl's algorithm.adv_estimator: grpo (the only one built).", "grpo")
    norm_adv_by_std_in_grpo: bool = _verl(
        "verl's algorithm.norm_adv_by_std_in_grpo: divide by the group std.", True
    )
    balance_batch: bool = _verl(
        "verl's trainer.balance_batch: reorder rows to balance tokens across ranks.", True
    )
    pad_token_id: NonNegative | None = _verl(
        "The tokenizer's pad token id, which verl pads prompts and responses with.", None
    )
    verl_target: str = _verl(
        "Which verl trainer reads the step: legacy (RayPPOTrainer, trainer.use_v1=false: "
        "rank files of its DataProto chunks) or v1 (the default V1 trainer, fed by "
        "rollout_shards_loader.verl_v1: the step's rows in order, V1 balances them).",
        "legacy",
    )

    @property
    def advantage_estimator(self) -> str:
        """The estimator as the rollout metrics name it (verl's adv_estimator)."""
        return self.adv_estimator

    @property
    def normalizes_rewards(self) -> bool:
        return True  # grpo, the one estimator built, always normalizes

    # verl's groups are its prompt groups (`group_index`): no fixed fan-out to the metrics
    n_samples_per_prompt: ClassVar[None] = None

    @staticmethod
    def derived(values: Mapping[str, Any]) -> dict[str, Any]:
        return {}

    @staticmethod
    def batch_stand_in(values: Mapping[str, Any]) -> dict[str, Any] | None:
        return None  # every batch setting it needs is checked by its profile


MODEL = VerlSettings

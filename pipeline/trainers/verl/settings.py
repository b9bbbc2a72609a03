"""verl's settings, named after its configuration keys, mixed into `Settings` (the verl
profile, `pipeline/trainers/verl/profile.py`, reads them; docs/verl.md maps each to its key)."""

from __future__ import annotations

import dataclasses
from typing import Any

from pipeline.trainers.miles.settings import NonNegative, Positive

# The fields below, by name (`Settings` lists them after its own and miles').
FIELDS: tuple[str, ...]


def _verl(description: str, default: Any) -> Any:
    return dataclasses.field(
        default=default, metadata={"description": description, "trainer": "verl"}
    )


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


FIELDS = tuple(f.name for f in dataclasses.fields(VerlSettings))

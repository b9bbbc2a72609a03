"""The verl trainer's settings, mixed into `Settings`: named after verl 0.9.1's own
configuration keys (docs/verl.md), read by the verl profile alone (`pipeline/trainers/
verl.py`) with `dp_size`. Their booleans take a value on the command line, as in verl's
config (`--balance-batch false`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from pipeline.miles_flags import NonNegative, Positive


def _setting(description: str, default: Any = None) -> Any:
    return dataclasses.field(default=default, metadata={"description": description})


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerlSettings:
    """verl's settings of CONTRACT section 3."""

    rollout_n: Positive | None = _setting(
        "verl's actor_rollout_ref.rollout.n: responses per prompt; each prompt group is "
        "exactly this many contiguous rows."
    )
    train_batch_size: Positive | None = _setting(
        "verl's data.train_batch_size: prompt groups per step."
    )
    max_prompt_length: Positive | None = _setting(
        "verl's data.max_prompt_length: prompts are left-padded to it."
    )
    max_response_length: Positive | None = _setting(
        "verl's data.max_response_length: responses are right-padded to it."
    )
    adv_estimator: str = _setting(
        "verl's algorithm.adv_estimator: grpo (the only one built).", "grpo"
    )
    norm_adv_by_std_in_grpo: bool = _setting(
        "verl's algorithm.norm_adv_by_std_in_grpo: divide by the group std.", True
    )
    balance_batch: bool = _setting(
        "verl's trainer.balance_batch: reorder rows to balance tokens across ranks.", True
    )
    pad_token_id: NonNegative | None = _setting(
        "The tokenizer's pad token id, which verl pads prompts and responses with."
    )


FIELDS = frozenset(f.name for f in dataclasses.fields(VerlSettings))
BOOLEANS = frozenset(f.name for f in dataclasses.fields(VerlSettings) if f.type == "bool")

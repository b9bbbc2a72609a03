"""The dynamic partitions of rollout steps: one partition per step found under the input root."""

from __future__ import annotations

import dagster as dg

# Keys are the step zero-padded to 8 digits, so the UI's string order is step order.
KEY_WIDTH = 8

rollout_steps = dg.DynamicPartitionsDefinition(name="rollout_steps")


def partition_key(step: int) -> str:
    """The partition key of a rollout step: `42` -> `00000042`."""
    return f"{step:0{KEY_WIDTH}d}"


def step_of(key: str) -> int:
    """The rollout step of a partition key; anything but exactly 8 ASCII digits is a
    `dg.Failure` (`int()` alone would take "1_0" as 10 and " 7" as 7)."""
    if len(key) != KEY_WIDTH or not key.isascii() or not key.isdigit():
        raise dg.Failure(
            description=f"partition key {key!r} is not a rollout step: keys are the step "
            f"zero-padded to {KEY_WIDTH} digits, e.g. {partition_key(7)} for step 7"
        )
    return int(key)

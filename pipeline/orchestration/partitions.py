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
    """The rollout step of a partition key."""
    return int(key)

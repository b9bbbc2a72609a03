"""miles' fully-async data buffer on CPU (tests/support/miles.py): which prompt groups its
`DefaultDataBuffer` keeps for an engine version under a staleness budget, and miles at
`SPANS_PIN` with that buffer and its rollout metrics imported."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.support import miles as ms

BUFFER = "miles.rollout.fully_async_data_buffer"


@contextmanager
def spans_modules(folder: Path) -> Iterator[SimpleNamespace]:
    """miles at SPANS_PIN (its source kept in `folder`), with `buffer` and `metrics`."""
    with ms.miles_modules(ms.head_source(folder, ms.SPANS_PIN)) as modules:
        modules.buffer = importlib.import_module(BUFFER)
        modules.metrics = importlib.import_module("miles.ray.rollout.metrics")
        yield modules


def buffer_kept(
    miles: Any, groups: dict[int, list[Any]], last: Any, version: int, budget: int
) -> tuple[list[int], dict[str, Any]]:
    """The keys of `groups` (miles samples by group_index) whose group the buffer hands back
    at engine `version` with `max_weight_staleness` `budget`, in its order, and its metrics.
    `last` (a sample of a fresh group) goes in last: getting it back ends the reading."""
    b = miles.buffer
    args = ms.Args(
        async_data_buffer_capacity_factor=1.0,
        rollout_batch_size=sum(map(len, groups.values())) + 1,
        dynamic_sampling_filter_path=None,
        max_weight_staleness=budget,
    )
    buffer = b.DefaultDataBuffer(b.DataBufferConstructorInput(args, lambda group: None))

    async def run() -> list[int]:
        for group in [*groups.values(), [last]]:
            await buffer.put(b.DataBufferInput(prompt_group=[], group=group))
        kept = []
        while (entry := await buffer.get(current_version=version)).group[0] is not last:
            kept.append(entry.group[0].group_index)
        return kept

    kept = asyncio.run(run())
    return kept, buffer.get_metrics()


def version_metrics(
    miles: Any, samples: list[Any], stats: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """miles' `weight_version/` metrics of `samples`, and a build's (its `stats` without the
    `rollout/` prefix; the mixed-version ratio only where miles logs it, beside numeric
    versions)."""
    args = ms.Args(n_samples_per_prompt=2, advantage_estimator="grpo", reward_key=None)
    theirs = miles.metrics._compute_metrics_from_samples(args, samples)
    want = {k: v for k, v in theirs.items() if k.startswith("weight_version/")}
    ours = {
        k.removeprefix("rollout/"): v
        for k, v in stats.items()
        if k.startswith("rollout/weight_version/")
    }
    if "weight_version/mean" not in want:
        ours.pop("weight_version/mixed_version_ratio", None)
    return want, ours

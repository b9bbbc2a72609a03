"""miles' trainer fed twice on CPU: by its own rollout side, and by the hook from a built
step folder; what each rank's `train()` received, compared."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rollout_shards_loader import miles as hook

from pipeline.settings import load_settings
from tests.support import miles as ms


def delayed_refs(miles: Any, args: Any, rows: list[dict[str, Any]], config: dict) -> Any:
    """miles' rollout manager under `--delay-split-train-data-by-dp`: the converted batch
    goes whole into the store; each rank's `process_rollout_data` splits it."""
    miles.object_store._INSTANCE = ms.memory_store(miles)
    return miles.object_store._INSTANCE.put(ms.train_data(miles, args, rows, config))


def both_paths(
    miles: Any, rows: list[dict[str, Any]], chosen: dict[str, Any], out: Path, rollout_id: int
) -> None:
    """miles' own `train()` on its rollout side's refs, then the same `train()` reading the
    built step folder through the hook: each rank's batch and micro-batches equal."""
    settings = load_settings(**chosen).to_dict()
    args = ms.miles_args(settings)
    config = ms.train_parallel_config(settings)
    if settings["delay_split_train_data_by_dp"]:
        refs = delayed_refs(miles, args, rows, config)
    else:
        refs = ms.rollout_side(miles, args, rows, config)
    actor, seen = ms.trainer(miles, args)
    dp = settings["dp_size"]
    for rank in range(dp):  # miles' own path: train() on the rollout side's refs
        ms.set_rank(miles, rank, settings)
        actor.train(rollout_id, refs)
    hook.install(out)
    for rank in range(dp):  # the hook: the same train() reads the step folder
        ms.set_rank(miles, rank, settings)
        actor.train(rollout_id, refs)
    assert len(seen) == 2 * dp
    for rank in range(dp):
        own, shards = seen[rank], seen[dp + rank]
        assert list(shards) == list(own)
        for key in own:
            assert ms.comparable(shards[key]) == ms.comparable(own[key]), (rank, key)
        ms.set_rank(miles, rank, settings)
        own_batches = ms.micro_batches(miles, args, own)
        shard_batches = ms.micro_batches(miles, args, shards)
        assert len(own_batches) > 1  # at least one micro-batch trained
        assert ms.comparable(shard_batches) == ms.comparable(own_batches), rank


class NoAllReduce:
    """One process plays every rank, so the DP-wide max of the micro-batch counts is each
    rank's own (the same on both paths)."""

    @staticmethod
    def create(group: Any) -> Any:
        return NoAllReduce()

    def all_reduce(self, tensor: Any, group: Any, op: Any = None) -> None:
        return None

"""Train a miles run from rollout-shards step folders, without a fork of miles.

miles' trainer gets its rank's data in one call: `get_rollout_data(args, rollout_data_ref)`
in `miles/backends/training_utils/data.py` calls `process_rollout_data(args,
rollout_data_ref, dp_rank, dp_size)` (defined in `miles/utils/data.py`, imported by name
into the training-utils module, so it is looked up there at call time). The training
actor's `train(self, rollout_id, rollout_data_ref, ...)` (`MegatronTrainRayActor` in
`miles/backends/megatron_utils/actor.py`) knows the step.

`install(root)` patches both, in the trainer process, before the first `train` call:
`train` sets the rollout id for the duration of the call, and `process_rollout_data`
returns `read_rank(<root>/step=<rollout_id>, dp_rank, dp_size=dp_size,
global_batch_size=args.global_batch_size)`. Outside a patched `train` call the original
`process_rollout_data` runs. Nothing of miles is imported until `install` is called.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
from pathlib import Path
from typing import Any

from rollout_shards_loader._read import read_rank

DATA_MODULE = "miles.backends.training_utils.data"
ORIGINAL = "_rollout_shards_original"  # not __wrapped__: miles' own decorators set that
ACTORS = ("miles.backends.megatron_utils.actor:MegatronTrainRayActor",)

_ROLLOUT_ID: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "rollout_shards_rollout_id", default=None
)


def _resolve(target: str) -> Any:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def install(
    root: str | Path, *, data_module: str = DATA_MODULE, actors: tuple[str, ...] = ACTORS
) -> None:
    """Make miles' trainer read rank data from `<root>/step=<rollout_id>/`.

    `data_module` is the module whose `process_rollout_data` the trainer calls;
    `actors` the `module:Class` training actors whose `train(rollout_id, ...)` is wrapped.
    Installing twice replaces nothing twice (the originals are kept once)."""
    data = importlib.import_module(data_module)
    original = getattr(data.process_rollout_data, ORIGINAL, data.process_rollout_data)

    @functools.wraps(original)
    def process_rollout_data(args, rollout_data_ref, dp_rank, dp_size, *rest, **kwargs):
        rollout_id = _ROLLOUT_ID.get()
        if rollout_id is None:
            return original(args, rollout_data_ref, dp_rank, dp_size, *rest, **kwargs)
        folder = Path(root) / f"step={rollout_id}"
        gbs = getattr(args, "global_batch_size", None)
        return read_rank(folder, dp_rank, dp_size=dp_size, global_batch_size=gbs)

    setattr(process_rollout_data, ORIGINAL, original)
    data.process_rollout_data = process_rollout_data
    for target in actors:
        actor = _resolve(target)
        actor.train = _with_rollout_id(getattr(actor.train, ORIGINAL, actor.train))


def _with_rollout_id(train: Any) -> Any:
    @functools.wraps(train)
    def wrapped(self, rollout_id, *args, **kwargs):
        token = _ROLLOUT_ID.set(int(rollout_id))
        try:
            return train(self, rollout_id, *args, **kwargs)
        finally:
            _ROLLOUT_ID.reset(token)

    setattr(wrapped, ORIGINAL, train)
    return wrapped

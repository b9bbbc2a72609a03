"""slime's own conversion code on CPU, as a test fixture: its source at the pinned commit,
its modules imported with the third-party packages they need stubbed, and its rollout
side run on rows.

Nothing of slime is in this repository. Its source comes from `SLIME_SOURCE` (a folder
holding `slime/`, or a git directory of THUDM/slime holding the pinned commit), else from
`git clone https://github.com/THUDM/slime` checked out at PIN into the user's cache
(`$XDG_CACHE_HOME` or `~/.cache`, then `rollout-shards/slime-<PIN>`). With neither, the
caller gets `SourceMissing` with one line saying what to set.

The path run is slime's own: `RolloutManager._get_rollout_data` (the rollout function's
nested output checked by `validate_rollout_id_annotated`, then flattened),
`_convert_samples_to_train_data` (with `_post_process_rewards`), `_split_train_data_by_dp`
(`build_dp_schedule`, `tensorize_rollout_data_for_training`), and on the trainer side
`slime.utils.data.process_rollout_data` per rank. Ray's object store is a dict handing out
deep copies, as `ray.get` hands out deserialized ones.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.support.miles import Args, comparable
from tests.support.miles import samples as miles_samples
from tests.support.peer_source import SourceMissing as SourceMissing
from tests.support.peer_source import source, stand_ins

URL = "https://github.com/THUDM/slime"
PIN = "624b824a898ab0ec1fcb4d373004c7f3852bf515"
SOURCE_ENV = "SLIME_SOURCE"
REPO = Path(__file__).resolve().parents[2]
# urllib3 real too: slime's sglang engine imports it, and torch's tensorboard (real) reaches
# it again through botocore where boto3 is installed, which a stand-in warning class breaks.
REAL = {"slime", "torch", "numpy", "typing_extensions", "pyarrow", "rollout_shards_loader"}
REAL |= {"urllib3"}
# Installed packages slime imports that must be stand-ins in its modules.
SET_ASIDE = {"ray", "sglang", "megatron", "transformers", "wandb", "verl", "tensordict"}


def slime_source() -> Path:
    """A folder holding slime's `slime/` package at PIN; SourceMissing without one."""
    return source("slime", URL, PIN, SOURCE_ENV, PIN)


# --- slime's modules with stand-ins -----------------------------------------------------


MODULES = {
    "rollout": "slime.ray.rollout",
    "data": "slime.utils.data",
    "schedule": "slime.utils.dp_schedule",
    "balancing": "slime.utils.seqlen_balancing",
    "flops": "slime.utils.flops_utils",
    "rollout_data": "slime.observability.rollout_data_utils",
    "types": "slime.utils.types",
    "misc": "slime.utils.misc",
    "actor": "slime.backends.megatron_utils.actor",
}


@contextlib.contextmanager
def slime_modules(source: Path) -> Iterator[types.SimpleNamespace]:
    """slime's rollout and trainer modules from `source`, imported with stand-ins; all of
    it (and CUDA pointed at the CPU) undone on exit."""
    # Packages another test of this process imported for real (Ray, by the verl and the
    # Ray tests) would be taken instead of stand-ins: set aside while slime's modules load.
    real = {
        name: sys.modules.pop(name)
        for name in list(sys.modules)
        if name.partition(".")[0] in SET_ASIDE
    }
    try:
        with stand_ins("slime", REAL, __name__, source):
            loaded = {key: importlib.import_module(name) for key, name in MODULES.items()}
            yield types.SimpleNamespace(**loaded)
    finally:
        sys.modules.update(real)


# --- rows -> slime's Samples, nested as a rollout function returns them ----------------

# slime's flags as its argument parser leaves them, for the ones the data path reads;
# the project's settings override them.
SLIME_DEFAULTS: dict[str, Any] = {
    "advantage_estimator": "grpo",
    "rewards_normalization": True,
    "grpo_std_normalization": True,
    "reward_key": None,
    "n_samples_per_prompt": 1,
    "micro_batch_size": 1,
    "use_dynamic_batch_size": False,
    "max_tokens_per_gpu": None,
    "balance_data": False,
    "balance_by_flops": False,
    "load_debug_rollout_data": None,
    "rollout_top_p": 1.0,
    "rollout_data_transport": "object-store",
    "debug_rollout_only": False,
    "offload_train": False,
    # Megatron's default: every layer is MoE when the model has experts
    "moe_layer_freq": 1,
    "moe_shared_expert_intermediate_size": None,
    "num_experts": None,
}

# the project's setting -> slime's parallel config key (what the trainer advertises)
PARALLEL = ("dp_size", "cp_size", "vpp_size", "microbatch_group_size_per_vp_stage")


def slime_args(settings: dict[str, Any]) -> Args:
    """The project's settings as slime's parsed args, after slime's own validation
    (`--balance-by-flops` turns on `--balance-data`; one sample per prompt turns off the
    std normalization)."""
    values = dict(SLIME_DEFAULTS)
    values.update({k: v for k, v in settings.items() if v is not None and k not in PARALLEL})
    if values["balance_by_flops"]:
        values["balance_data"] = True
    if values["n_samples_per_prompt"] == 1:
        values["grpo_std_normalization"] = False
    return Args(**values)


def train_parallel_config(settings: dict[str, Any]) -> dict[str, Any]:
    """What slime's Megatron actor advertises: every key, 1 where not given."""
    return {key: settings.get(key) or 1 for key in PARALLEL}


def samples(m: types.SimpleNamespace, rows: list[dict[str, Any]]) -> list[Any]:
    """Input rows as slime's `Sample`s, each field where slime keeps it (its `metadata`
    too, where slime reads `source_name`)."""
    return miles_samples(m, rows, with_metadata=True)


def _runs(items: list[Any], key: Any) -> list[list[Any]]:
    runs: list[list[Any]] = []
    previous: Any = object()
    for item in items:
        current = key(item)
        if not runs or current != previous:
            runs.append([])
            previous = current
        runs[-1].append(item)
    return runs


def nested(sample_list: list[Any]) -> list[Any]:
    """The samples as slime's rollout function returns them, flattening to batch order:
    prompt groups (runs of one `group_index`) of rollouts; with a multi-leaf rollout
    (a run of one `index` with several samples) every rollout is a list of its samples
    (slime's compact shape, depth 3), else a rollout is its sample (depth 2)."""
    groups = _runs(sample_list, lambda s: s.group_index)
    calls = [_runs(group, lambda s: s.index) for group in groups]
    if any(len(call) > 1 for group in calls for call in group):
        return calls
    return [[call[0] for call in group] for group in calls]


# --- slime's own path ---------------------------------------------------------------


class MemoryStore:
    """Ray's `put`/`get` over a dict; `get` hands out a deep copy."""

    def __init__(self) -> None:
        self.values: dict[int, Any] = {}

    def put(self, value: Any, **options: Any) -> int:
        key = len(self.values)
        self.values[key] = copy.deepcopy(value)
        return key

    def get(self, key: int) -> Any:
        return copy.deepcopy(self.values[key])


def rollout_manager(m: types.SimpleNamespace, args: Args, config: dict[str, Any]) -> Any:
    """A `RolloutManager` as `__init__` leaves it for these code paths (no servers, no
    custom functions), its Ray calls going to a `MemoryStore`."""
    store = MemoryStore()
    fake_ray = types.SimpleNamespace(put=store.put, get=store.get)
    m.rollout.ray = fake_ray
    m.data.ray = fake_ray
    manager = object.__new__(m.rollout.RolloutManager)
    manager.args = args
    manager.custom_reward_post_process_func = None
    manager.custom_convert_samples_to_train_data_func = None
    manager.generate_rollout = None
    manager.data_source = None
    manager.set_train_parallel_config(config)
    return manager


def rollout_side(
    m: types.SimpleNamespace, settings: dict[str, Any], rows: list[dict[str, Any]]
) -> tuple[list[Any], list[Any]]:
    """slime's rollout manager from the rollout function's output to the per-rank refs
    `train()` receives; also the flattened samples (after the conversion mutated them)."""
    args = slime_args(settings)
    manager = rollout_manager(m, args, train_parallel_config(settings))
    output = nested(samples(m, rows))
    m.rollout.call_rollout_fn = lambda *a, **k: types.SimpleNamespace(samples=output, metrics=None)
    flat, _metrics = manager._get_rollout_data(rollout_id=0)
    train_data = manager._convert_samples_to_train_data(flat)
    return manager._split_train_data_by_dp(train_data), flat


def rank_dicts(
    m: types.SimpleNamespace, settings: dict[str, Any], rows: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """What slime's `process_rollout_data(args, refs, rank, dp_size)` returns, per rank."""
    refs, _flat = rollout_side(m, settings, rows)
    args = slime_args(settings)
    return [m.data.process_rollout_data(args, refs, rank, len(refs)) for rank in range(len(refs))]


def canonical(value: Any) -> Any:
    """A value with its types kept and floats by their bits; a torch tensor and the
    reference's `SlimeTensor` both as ("tensor", dtype, values)."""
    from tests.reference import SlimeTensor

    if isinstance(value, SlimeTensor):
        dtype, values = value
        return ("tensor", dtype, (len(values),), canonical(values))
    return comparable(value, canonical)


def save_dump(m: types.SimpleNamespace, rows: list[dict[str, Any]], path: Path, step: int) -> None:
    """The rows as slime's `save_debug_rollout_data` writes them (`--save-debug-rollout-data`,
    or `--dump-details D` -> D/rollout_data/<step>.pt): its own function on its Samples."""
    template = str(path.parent / "{rollout_id}.pt")
    m.rollout_data.save_debug_rollout_data(
        template, samples(m, rows), rollout_id=step, evaluation=False
    )


def rank_dicts_from_dump(
    m: types.SimpleNamespace, settings: dict[str, Any], template: str, step: int
) -> list[dict[str, Any]]:
    """What slime's trainer holds per rank when its rollout manager loads the dump
    (`--load-debug-rollout-data`: `torch.load` and `Sample.from_dict`) and converts it."""
    args = slime_args({**settings, "load_debug_rollout_data": template})
    manager = rollout_manager(m, args, train_parallel_config(settings))
    flat, _metrics = manager._get_rollout_data(rollout_id=step)
    refs = manager._split_train_data_by_dp(manager._convert_samples_to_train_data(flat))
    return [m.data.process_rollout_data(args, refs, rank, len(refs)) for rank in range(len(refs))]

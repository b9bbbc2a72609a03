"""miles' own trainer code on CPU, as a test fixture: its source, its modules imported with
the third-party packages it needs stubbed, and its rollout-side conversion run on rows.

Nothing of miles is in this repository. Its source at PIN comes from `MILES_SOURCE` (a
folder holding `miles/`, or a git directory of radixark/miles holding PIN), else from
`git clone https://github.com/radixark/miles` checked out at PIN into the user's cache
(`$XDG_CACHE_HOME` or `~/.cache`, then `rollout-shards/miles-<PIN>`); a machine without
GitHub maps that URL to a copy of its own with git's `url.<base>.insteadOf`. With neither,
the caller gets `SourceMissing`, one line saying what to set. The release on PyPI
(`miles-rl`, an older miles whose `process_rollout_data` returns the rank dict) comes from
`pip download`.

Imports made by miles' own modules resolve to real packages for the standard library,
torch, numpy and miles itself, and to permissive stand-ins for everything else (Ray,
Megatron, SGLang, transformers, ...), whose attributes are classes that can be called,
subclassed, used as decorators (returning what they decorate) or looked into further.
CUDA calls are pointed at the CPU.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib
import importlib.abc
import importlib.machinery
import json
import subprocess
import sys
import types
import zipfile
from argparse import Namespace
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.peer_source import (
    SourceMissing,
    source,
    stand_ins,
)

URL = "https://github.com/radixark/miles"
PIN = "31f1ca961a94cb860cec3b2dea34ec332bfa8f76"
# the heads of miles' PRs after PIN that change what its trainer receives: per-call weight
# version spans (#1891, #1892) and the sampling-support transport (#2595, on PIN)
SPANS_PIN = "204b0f904eabdfbf571af2b2d221e16339aa48e9"
SAMPLING_MASK_PIN = "301be963391856ede8e93a3222395be9be89e70b"
SOURCE_ENV = "MILES_SOURCE"
RELEASE = "miles-rl==0.0.2"
REAL = {"miles", "torch", "numpy", "typing_extensions", "pyarrow", "rollout_shards_loader"}


def head_source(cache: Path | None = None, commit: str = PIN) -> Path:
    """A folder holding the `miles/` package of miles at `commit` (the module's docstring
    says from where); without one the test fails with the one line saying what to set.
    `cache` is unused, kept for callers that pass a scratch folder."""
    try:
        return miles_source(commit)
    except SourceMissing as exc:
        missing = str(exc)
    pytest.fail(missing, pytrace=False)


def miles_source(commit: str = PIN) -> Path:
    """A folder holding the `miles/` package of miles at `commit` (40 hex digits);
    SourceMissing without one."""
    return source("miles", URL, PIN, SOURCE_ENV, commit)


def release_source(cache: Path) -> Path:
    """A folder holding the `miles/` package of the PyPI release (`pip download`)."""
    out = cache / "miles-release"
    if (out / "miles" / "__init__.py").is_file():
        return out
    wheels = cache / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", RELEASE, "-d", str(wheels)],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.glob("miles_rl-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(out, [n for n in archive.namelist() if n.startswith("miles/")])
    return out


@contextlib.contextmanager
def miles_modules(source: Path) -> Iterator[types.SimpleNamespace]:
    """miles' trainer-side modules from `source`, imported with stand-ins; everything
    imported (and CUDA pointed at the CPU) is undone on exit."""
    with stand_ins("miles", REAL, __name__, source):
        names = {
            "actor": "miles.backends.megatron_utils.actor",
            "data": "miles.backends.training_utils.data",
            "utils_data": "miles.utils.data",
            "types": "miles.utils.types",
        }
        optional = {
            "conversion": "miles.ray.rollout.train_data_conversion",
            "postprocess": "miles.ray.rollout.rollout_data_conversion",
            "object_store": "miles.utils.object_store",
            "loss": "miles.backends.training_utils.loss",
        }
        loaded = {key: importlib.import_module(name) for key, name in names.items()}
        for key, name in optional.items():
            if (source / Path(*name.split("."))).with_suffix(".py").is_file():
                loaded[key] = importlib.import_module(name)
        yield types.SimpleNamespace(**loaded)


# --- miles' own path: rows -> Samples -> the rollout side's shards -> the trainer -------


class Args(Namespace):
    """miles' parsed arguments: the values given, None for every other flag (an unset
    optional flag), as the code paths exercised here read them."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return None


TRAINER_ARGS: dict[str, Any] = {
    "qkv_format": "thd",
    "debug_rollout_only": True,
    "offload_train": False,
    "enable_witness": False,
    "delay_split_train_data_by_dp": False,
    "kl_coef": 0.0,
    "use_kl_loss": False,
    "use_rollout_logprobs": False,
    "normalize_advantages": False,
    "use_opd": False,
    "skip_actor_forward_only": False,
    "compress_ratios": None,
    "data_pad_size_multiplier": 1,
    "gamma": 1.0,
    "lambd": 1.0,
    "multi_lora": False,
}


def miles_args(settings: dict[str, Any], **overrides: Any) -> Args:
    """The project's settings (every field, as `load_settings` fills them) as miles' args;
    an unset fan-out matches no batch size (miles then takes one reward group)."""
    values = {**TRAINER_ARGS, **settings, **overrides}
    values["n_samples_per_prompt"] = settings.get("n_samples_per_prompt") or 1
    values["rollout_batch_size"] = settings.get("rollout_batch_size") or 0
    values["micro_batch_size"] = settings.get("micro_batch_size") or 1  # miles' default
    return Args(**values)


def train_parallel_config(settings: dict[str, Any]) -> dict[str, Any]:
    """What the trainer advertises to the rollout side; the schedule keys only when the
    step is scheduled there (the project's `cp_size` set)."""
    config: dict[str, Any] = {"dp_size": settings["dp_size"]}
    if settings.get("cp_size") is not None:
        config["cp_size"] = settings["cp_size"]
        config["vpp_size"] = settings.get("vpp_size")
        config["microbatch_group_size_per_vp_stage"] = settings.get(
            "microbatch_group_size_per_vp_stage"
        )
    return config


def samples(
    m: types.SimpleNamespace, rows: list[dict[str, Any]], with_metadata: bool = False
) -> list[Any]:
    """Input rows as miles' `Sample`s (or slime's, the same fields), each field where the
    trainer keeps it; `with_metadata`: the `metadata` column's JSON object under them."""
    sample_type = m.types.Sample
    out = []
    for row in rows:
        given = with_metadata and row.get("metadata") is not None
        metadata = json.loads(row["metadata"]) if given else {}
        if row.get("raw_reward") is not None:
            metadata["raw_reward"] = row["raw_reward"]
        if row.get("round_number") is not None:
            metadata["round_number"] = row["round_number"]
        train_metadata = row.get("train_metadata")
        out.append(
            sample_type(
                group_index=row.get("group_index"),
                index=row.get("index"),
                rollout_id=row.get("rollout_id"),
                tokens=list(row["tokens"]),
                response_length=row["response_length"],
                reward=_float_reward(row["reward"]),
                loss_mask=None if row.get("loss_mask") is None else list(row["loss_mask"]),
                weight_versions=_weight_versions(m, row),
                rollout_log_probs=row.get("rollout_log_probs"),
                teacher_log_probs=row.get("teacher_log_probs"),
                remove_sample=bool(row.get("remove_sample") or False),
                status=sample_type.Status(row["status"]),
                metadata=metadata,
                train_metadata=None if train_metadata is None else json.loads(train_metadata),
                **_sampling_masks(sample_type, row),
            )
        )
    return out


def _weight_versions(m: types.SimpleNamespace, row: dict[str, Any]) -> list[Any]:
    """A row's weight versions as the Sample at hand holds them: strings before miles'
    per-call spans (#1891), one `WeightVersionsPerCall` per generation call after (the
    row's `weight_version_spans`); a row of strings reaches a spans Sample as miles loads
    an old dump (`legacy_weight_versions`, not a field: dropped)."""
    per_call = getattr(m.types, "WeightVersionsPerCall", None)
    spans = row.get("weight_version_spans")
    if per_call is None:
        assert not spans, "weight_version_spans need miles at SPANS_PIN or later"
        return list(row.get("weight_versions") or [])
    if spans is None:
        return []  # the string form, as miles since #1892 loads it
    return [per_call.from_dicts([dict(span) for span in call]) for call in spans]


def _sampling_masks(sample_type: Any, row: dict[str, Any]) -> dict[str, Any]:
    """The row's sampling-support columns, on a Sample that has them (#2595)."""
    names = ("rollout_sampling_mask_ids", "rollout_sampling_mask_offsets")
    fields = getattr(sample_type, "__dataclass_fields__", {})
    return {n: None if row.get(n) is None else list(row[n]) for n in names if n in fields}


def _float_reward(reward: Any) -> Any:
    """The contract's reward is float64 (or a struct of float64): an int written by a test
    builder reaches the shards as that float, and reaches miles as one too."""
    if isinstance(reward, dict):
        return {k: _float_reward(v) for k, v in reward.items()}
    return float(reward) if isinstance(reward, int) else reward


def memory_store(m: types.SimpleNamespace) -> Any:
    """miles' object store interface over a dict; `get` hands out a deep copy, as
    `ray.get` hands out a deserialized one."""
    base = m.object_store.BaseObjectStore

    class MemoryStore(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self.values: dict[int, Any] = {}

        def put(self, value: Any, value_spec: Any = None) -> Any:
            key = len(self.values)
            self.values[key] = copy.deepcopy(value)
            return m.object_store.Box(key)

        def get(self, ref: Any) -> Any:
            value = copy.deepcopy(self.values[ref.inner])
            return m.object_store.ObjectStoreGetResult(value=value, release_fn=lambda v: None)

        def remove(self, ref: Any) -> None:
            self.values.pop(ref.inner, None)

    return MemoryStore()


def rollout_side(
    m: types.SimpleNamespace, args: Args, rows: list[dict[str, Any]], config: dict[str, Any]
) -> Any:
    """miles' rollout manager from samples to the per-rank refs `train()` receives:
    `postprocess_rollout_data`, `convert_samples_to_train_data`, `split_train_data_by_dp`."""
    m.object_store._INSTANCE = memory_store(m)
    if not any(isinstance(row["reward"], dict) for row in rows):
        # the project reads `reward_key` in struct rewards only; miles would index a float
        args = Args(**{**vars(args), "reward_key": None})
    return m.conversion.split_train_data_by_dp(args, train_data(m, args, rows, config), config)


def train_data(
    m: types.SimpleNamespace, args: Args, rows: list[dict[str, Any]], config: dict[str, Any]
) -> Any:
    """miles' converted batch: `postprocess_rollout_data`, `convert_samples_to_train_data`
    without custom functions."""
    data, metadata = m.postprocess.postprocess_rollout_data(args, samples(m, rows), config)
    return m.conversion.convert_samples_to_train_data(
        args,
        data,
        metadata=metadata,
        custom_convert_samples_to_train_data_func=None,
        custom_reward_post_process_func=None,
    )


def set_rank(m: types.SimpleNamespace, rank: int, settings: dict[str, Any]) -> None:
    """miles' parallel state for data-parallel rank `rank` (no process groups: one
    process plays each rank in turn)."""
    parallel = sys.modules["miles.backends.training_utils.parallel"]
    info = getattr(parallel, "GroupInfo", None)
    if info is None:
        info = sys.modules["miles.utils.ft_utils.process_group_utils"].GroupInfo
    dp = settings["dp_size"]
    one = info(rank=0, size=1, group=None)
    cp = settings.get("cp_size") or 1
    values = {
        "intra_dp": info(rank=rank, size=dp, group=None),
        "intra_dp_cp": info(rank=rank, size=dp * cp, group=None),
        "cp": info(rank=0, size=cp, group=None),
        "tp": one,
        "pp": one,
        "ep": one,
        "etp": one,
        "indep_dp": one,
        "vpp_size": settings.get("vpp_size") or 1,
        "microbatch_group_size_per_vp_stage": settings.get("microbatch_group_size_per_vp_stage"),
    }
    fields = {f.name for f in dataclasses.fields(parallel.ParallelState)}
    parallel.set_parallel_state(
        parallel.ParallelState(**{k: v for k, v in values.items() if k in fields})
    )


def trainer(m: types.SimpleNamespace, args: Args) -> tuple[Any, list[dict[str, Any]]]:
    """A `MegatronTrainRayActor` as `init()` leaves it for `--debug-rollout-only`, and the
    list its `train()` appends each rollout dict to (where it logs it)."""
    actor = object.__new__(m.actor.MegatronTrainRayActor)
    actor.args = args
    actor.role = "actor"
    actor._asleep = False
    actor._heartbeat = types.SimpleNamespace(bump=lambda: None)
    seen: list[dict[str, Any]] = []
    m.actor.log_rollout_data = lambda rollout_id, args, rollout_data: seen.append(rollout_data)
    return actor, seen


def micro_batches(
    m: types.SimpleNamespace, args: Args, rollout_data: dict[str, Any]
) -> list[dict[str, Any]]:
    """What the trainer computes from a rank's dict: advantages and returns (miles'
    `compute_advantages_and_returns`, with per-token log probs and values made from the
    tokens in place of a model's forward pass), then every micro-batch `get_batch` builds
    from `get_data_iterator`'s schedule."""
    import torch

    data = dict(rollout_data)
    data["log_probs"] = [
        -0.001 * t[-r:].to(torch.float32) if r else torch.zeros(0)
        for t, r in zip(data["tokens"], data["response_lengths"], strict=True)
    ]
    data["values"] = [x * 0.5 for x in data["log_probs"]]
    m.loss.compute_advantages_and_returns(args, data)
    iterators, num_microbatches = m.data.get_data_iterator(args, None, data)
    keys = [
        k
        for k in (
            "tokens",
            "loss_masks",
            "total_lengths",
            "response_lengths",
            "rewards",
            "advantages",
            "returns",
            "rollout_log_probs",
            "rollout_mask_sums",
            "rollout_ids",
            "sample_indices",
        )
        if k in data
    ]
    out: list[dict[str, Any]] = [{"num_microbatches": list(num_microbatches)}]
    for _ in range(sum(num_microbatches)):
        out.append(m.data.get_batch(iterators[0], keys, pad_multiplier=128, qkv_format="thd"))
    return out


def comparable(value: Any, inner: Any = None) -> Any:
    """A value with tensors as (dtype, shape, values), floats by their bits, types kept;
    what it holds made comparable by `inner` (this function unless given)."""
    import torch

    inner = inner or comparable

    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.shape), inner(value.tolist()))
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, float):
        return ("float", value.hex())
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [inner(v) for v in value])
    if isinstance(value, dict):
        return ("dict", [(k, inner(v)) for k, v in value.items()])
    return (type(value).__name__, repr(value))


# What Megatron's parser leaves in miles' args for a model flag not given
# (megatron/training/arguments.py: `_add_mla_args`, the MoE group, TransformerConfig's
# argparse defaults), and what its `validate_args` derives.
MEGATRON_PARSER: dict[str, Any] = {
    "num_query_groups": 1,
    "kv_channels": None,
    "num_experts": None,
    "moe_router_topk": 2,
    "moe_ffn_hidden_size": None,
    "moe_layer_freq": 1,
    "moe_shared_expert_intermediate_size": None,
    "q_lora_rank": None,
    "kv_lora_rank": 32,
    "qk_head_dim": 128,
    "qk_pos_emb_head_dim": 64,
    "v_head_dim": 128,
}


def megatron_args(model: dict[str, Any], **other: Any) -> Args:
    """miles' args for these model flags, as Megatron's parser and `validate_args` fill them."""
    values = {**MEGATRON_PARSER, **model}
    if values["kv_channels"] is None:
        values["kv_channels"] = values["hidden_size"] // values["num_attention_heads"]
    if values["num_experts"] is not None and values["moe_ffn_hidden_size"] is None:
        values["moe_ffn_hidden_size"] = values["ffn_hidden_size"]
    return Args(**{**values, **other})


def miles_layout(result: tuple[Any, ...], dp: int) -> dict[str, Any]:
    """build_dp_schedule's result per rank: rows in order, each row's train step and
    micro-batch within it."""
    partitions, micro_batch_indices, num_microbatches, num_rollouts = result
    ranks = []
    for rank in range(dp):
        steps, micro = [], []
        batches = iter(micro_batch_indices[rank])
        for step, count in enumerate(num_microbatches):
            for m in range(count):
                for _ in next(batches):
                    steps.append(step)
                    micro.append(m)
        ranks.append((list(partitions[rank]), steps, micro))
    return {"ranks": ranks, "num_rollouts": num_rollouts, "num_microbatches": num_microbatches}


def kept_modules(tmp_path_factory: Any, **extra: str) -> types.SimpleNamespace:
    """miles' modules at HEAD and `extra` (attribute name to module), kept after their
    import context closes (a module-scoped fixture's value)."""
    source = head_source(tmp_path_factory.mktemp("miles"))
    with miles_modules(source) as modules:
        for key, name in extra.items():
            setattr(modules, key, importlib.import_module(name))
    return modules

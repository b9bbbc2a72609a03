"""balance_by_flops against miles' own code on CPU (tests/support/miles.py): each
row's FLOPs against `calculate_fwd_flops([length], args)` bit for bit, and the rollout-side
schedule against `build_dp_schedule` (row order, train step and micro-batch of every row
of every rank, the micro-batch and rollout counts) over dense, GQA, MoE and MLA models,
compact batches and not, and a grid of dp, cp, vpp and token budgets."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import StepError
from pipeline.settings import load_settings
from pipeline.trainers.miles.schedule import rollout_schedule
from pipeline.transforms.flops import forward_flops, miles_model_shape
from tests import reference
from tests.support import miles as ms
from tests.support.miles import MEGATRON_PARSER, megatron_args, miles_layout
from tests.support.strategies import by_flops, rollout_keys

DENSE = {
    "num_layers": 4,
    "hidden_size": 64,
    "ffn_hidden_size": 176,
    "num_attention_heads": 8,
    "vocab_size": 1000,
}
MODELS: dict[str, dict[str, Any]] = {
    "dense": DENSE,
    "gqa": {**DENSE, "num_query_groups": 2, "kv_channels": 16},
    "moe_every_2nd": {
        **DENSE,
        "num_experts": 8,
        "moe_router_topk": 2,
        "moe_ffn_hidden_size": 32,
        "moe_layer_freq": 2,
    },
    "moe_pattern_shared": {
        **DENSE,
        "num_experts": 16,
        "moe_layer_freq": [0, 1, 1, 1],
        "moe_shared_expert_intermediate_size": 48,
    },
    "mla": {**DENSE, "kv_lora_rank": 16, "qk_head_dim": 12, "qk_pos_emb_head_dim": 4},
    "mla_q_lora": {
        **DENSE,
        "q_lora_rank": 24,
        "kv_lora_rank": 16,
        "qk_head_dim": 12,
        "qk_pos_emb_head_dim": 4,
        "v_head_dim": 10,
    },
    "no_rope_dims": {**DENSE, "qk_pos_emb_head_dim": 0, "v_head_dim": 0},
}


@pytest.fixture(scope="module")
def miles(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """miles' modules, kept after their import context closes (the project's own lazy
    imports made inside it would be unloaded with it)."""
    source = ms.head_source(tmp_path_factory.mktemp("miles"))
    with ms.miles_modules(source):
        return (
            importlib.import_module("miles.utils.flops_utils"),
            importlib.import_module("miles.utils.dp_schedule"),
        )


def _bits(values: Any) -> list[str]:
    return [float(v).hex() for v in values]


LENGTHS = [1, 2, 3, 17, 100, 4096, 131072, 1_000_003, 2**31 + 11, 2**40 + 3]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_rows_flops_are_miles_own(miles: Any, name: str) -> None:
    flops_utils, _ = miles
    model = MODELS[name]
    shape = miles_model_shape(load_settings(global_batch_size=1, **model))
    args = megatron_args(model)
    expected = [flops_utils.calculate_fwd_flops([n], args) for n in LENGTHS]
    assert all(type(value) is float for value in expected)
    assert _bits(forward_flops(np.array(LENGTHS), shape)) == _bits(expected)
    # the per-sample reference, one Python expression per row
    assert _bits(reference.forward_flops(LENGTHS, args)) == _bits(expected)


@pytest.mark.parametrize("name", ["dense", "gqa", "mla_q_lora"])
def test_plain_projections_without_lora(miles: Any, name: str) -> None:
    """The branches Megatron's defaults never reach (its kv_lora_rank is always set) are
    the arithmetic slime shares: still bit for bit."""
    flops_utils, _ = miles
    model = MODELS[name]
    shape = miles_model_shape(load_settings(global_batch_size=1, **model))
    plain = dataclasses.replace(shape, kv_lora_rank=None, q_lora_rank=None)
    args = megatron_args(model, kv_lora_rank=None, q_lora_rank=None)
    expected = [flops_utils.calculate_fwd_flops([n], args) for n in LENGTHS]
    assert _bits(forward_flops(np.array(LENGTHS), plain)) == _bits(expected)


def our_layout(keys: list[int], lengths: list[int], values: dict[str, Any]) -> dict[str, Any]:
    s = load_settings(**values)
    flops = forward_flops(np.array(lengths), miles_model_shape(s))
    layout = rollout_schedule(np.array(keys), np.array(lengths), s, flops)
    order, rank = layout.order.to_list(), layout.rank.to_list()
    steps, micro = layout.train_step.to_list(), layout.micro_batch.to_list()  # type: ignore[union-attr]
    ranks = []
    for r in range(s.dp_size):
        mine = [i for i, x in enumerate(rank) if x == r]
        ranks.append(([order[i] for i in mine], [steps[i] for i in mine], [micro[i] for i in mine]))
    return {
        "ranks": ranks,
        "num_rollouts": layout.num_rollouts,
        "num_microbatches": layout.num_microbatches,
    }


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[int], list[int], dict[str, Any]]:
    n_rollouts, compact, keys = draw(rollout_keys(4))
    wide = draw(st.booleans())
    top = 40_000 if wide else 300
    lengths = draw(st.lists(st.integers(1, top), min_size=len(keys), max_size=len(keys)))
    vpp = draw(st.sampled_from([None, 1, 2]))
    values = {
        **MODELS[draw(st.sampled_from(sorted(MODELS)))],
        "global_batch_size": draw(st.integers(1, n_rollouts)),
        "dp_size": 1,  # set below: global_batch_size must divide
        "cp_size": draw(st.integers(1, 2)),
        **by_flops(draw, vpp, top),
        "allow_partial_train_step": draw(st.booleans()),
        "balance_data": draw(st.booleans()),
    }
    dp = draw(st.sampled_from([d for d in (1, 2, 4, 8) if values["global_batch_size"] % d == 0]))
    values["dp_size"] = dp
    return keys, lengths, values


@settings(max_examples=250, deadline=None)
@given(batches())
def test_schedule_by_flops_is_miles_own(
    miles: Any, case: tuple[list[int], list[int], dict[str, Any]]
) -> None:
    _, dp_schedule = miles
    keys, lengths, values = case
    model = {name: values[name] for name in values if name in MEGATRON_PARSER or name in DENSE}
    args = megatron_args(
        model,
        use_dynamic_batch_size=True,
        max_tokens_per_gpu=values["max_tokens_per_gpu"],
        balance_by_flops=True,
        balance_data=values["balance_data"],
        allow_partial_train_step=values["allow_partial_train_step"],
        micro_batch_size=1,
    )
    config = ms.train_parallel_config(values)
    try:
        result = dp_schedule.build_dp_schedule(
            args,
            config,
            lengths,
            global_batch_size=values["global_batch_size"],
            rollout_indices=keys,
        )
    except AssertionError:
        with pytest.raises(StepError):
            our_layout(keys, lengths, values)
        return
    assert our_layout(keys, lengths, values) == miles_layout(result, values["dp_size"])


def test_balance_by_flops_needs_dynamic_micro_batches_and_the_shape() -> None:
    from pipeline.errors import UsageError

    with pytest.raises(UsageError, match="balance_by_flops needs use_dynamic_batch_size"):
        load_settings(global_batch_size=2, balance_by_flops=True, **DENSE)
    with pytest.raises(UsageError, match="needs the model's shape: set vocab_size"):
        load_settings(
            global_batch_size=2,
            balance_by_flops=True,
            use_dynamic_batch_size=True,
            max_tokens_per_gpu=8,
            **{k: v for k, v in DENSE.items() if k != "vocab_size"},
        )
    with pytest.raises(UsageError, match="moe_layer_freq lists 3 layers but num_layers=4"):
        load_settings(global_batch_size=2, **DENSE, num_experts=2, moe_layer_freq=[0, 1, 1])

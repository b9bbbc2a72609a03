"""tests/reference.py's slime reference against slime's own code at the pinned commit
(tests/support/slime.py): each rank's dict after `process_rollout_data`, tensors by
dtype and values, floats bit for bit, over the issue's cases (tests/support/slime_cases.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests import reference
from tests.support import slime as ss
from tests.support.slime_cases import CASES, random_case


@pytest.mark.parametrize("name", CASES)
def test_reference_is_slime(slime: Any, name: str) -> None:
    rows, settings = CASES[name]
    theirs = ss.rank_dicts(slime, settings, copy.deepcopy(rows))
    ours = reference.slime_rank_dicts(copy.deepcopy(rows), settings)
    assert [ss.canonical(d) for d in ours] == [ss.canonical(d) for d in theirs]


BIG_DENSE = {
    "num_layers": 80,
    "hidden_size": 8192,
    "ffn_hidden_size": 28672,
    "num_attention_heads": 64,
    "num_query_groups": 8,
    "kv_channels": 128,
    "vocab_size": 152064,
}
BIG_MOE = {
    **BIG_DENSE,
    "num_experts": 128,
    "moe_ffn_hidden_size": 1536,
    "moe_router_topk": 8,
    "moe_shared_expert_intermediate_size": 4096,
    "moe_layer_freq": [0] * 3 + [1] * 77,
}


@pytest.mark.parametrize("shape", [BIG_DENSE, BIG_MOE, {**BIG_MOE, "moe_layer_freq": 2}])
def test_flops_are_slimes(slime: Any, shape: dict[str, Any]) -> None:
    """The pipeline's FLOPs and the reference's against slime's `calculate_fwd_flops`, bit
    for bit, for model sizes whose sums pass 2**53."""
    import numpy as np

    from pipeline.settings import load_settings
    from pipeline.transforms.flops import forward_flops, slime_model_shape

    lengths = [1, 7, 4096, 32768, 131072]
    args = ss.slime_args(shape)
    theirs = [slime.flops.calculate_fwd_flops([n], args) for n in lengths]
    settings = load_settings(trainer="slime", global_batch_size=1, rollout_batch_size=1, **shape)
    ours = forward_flops(np.asarray(lengths), slime_model_shape(settings)).tolist()
    assert [float(v).hex() for v in ours] == [float(v).hex() for v in theirs]
    if shape is BIG_DENSE:  # the reference models dense layers and all-MoE models
        merged = reference.slime_settings(shape)
        expected = [reference.slime_fwd_flops(n, merged) for n in lengths]
        assert [float(v).hex() for v in expected] == [float(v).hex() for v in theirs]
    assert max(theirs) > 2**53


@pytest.mark.parametrize("seed", range(40))
def test_reference_is_slime_on_random_cases(slime: Any, seed: int) -> None:
    rows, settings = random_case(seed)
    try:
        theirs = [ss.canonical(d) for d in ss.rank_dicts(slime, settings, copy.deepcopy(rows))]
    except AssertionError:
        theirs = None  # slime refuses the layout (an assert in build_dp_schedule)
    try:
        ours = [ss.canonical(d) for d in reference.slime_rank_dicts(copy.deepcopy(rows), settings)]
    except ValueError:
        ours = None
    assert ours == theirs

"""tests/reference.py's slime reference against slime's own code at the pinned commit
(tests/support/slime.py): each rank's dict after `process_rollout_data`, tensors by
dtype and values, floats bit for bit, over the issue's cases (tests/support/slime_cases.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests import reference
from tests.support import slime as ss
from tests.support.slime_cases import CASES


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


def _random_case(seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows and settings drawn from a seed: groups of varied sizes, multi-leaf calls with
    small ids, repeated rewards, and a random layout (some that slime refuses)."""
    import random

    from tests.support.samples import sample
    from tests.support.slime_cases import DENSE

    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    index = 0
    for group in range(rng.randint(2, 6)):
        for _ in range(rng.randint(1, 4)):
            leaves = rng.choice([1, 1, 1, 2, 3])
            rollout_id = rng.choice([0, 1, 2, 5]) + 10 * index if leaves > 1 else None
            reward = rng.choice([0.0, 0.5, 1.0, 0.9, 0.1])
            for leaf in range(leaves):
                rows.append(
                    sample(
                        index,
                        leaf,
                        group_index=group,
                        rollout_id=rollout_id,
                        session_version="v2" if leaves > 1 else None,
                        reward=reward if leaf == 0 or rng.random() < 0.7 else 0.25,
                        response_length=rng.randint(0, 9),
                    )
                )
            index += 1
    dp = rng.choice([1, 2, 4])
    settings: dict[str, Any] = {
        "dp_size": dp,
        "global_batch_size": dp * rng.randint(1, 3),
        "rollout_batch_size": rng.randint(1, 6),
        "n_samples_per_prompt": rng.choice([1, 2, 3]),
        "advantage_estimator": rng.choice(["grpo", "gspo", "ppo", "reinforce_plus_plus_baseline"]),
        "micro_batch_size": rng.choice([1, 2]),
        **DENSE,
    }
    if rng.random() < 0.5:
        settings |= {"use_dynamic_batch_size": True, "max_tokens_per_gpu": rng.randint(4, 30)}
        settings["balance_by_flops"] = rng.random() < 0.3
    settings["balance_data"] = rng.random() < 0.4
    if rng.random() < 0.3:
        settings |= {"vpp_size": 2, "microbatch_group_size_per_vp_stage": 2}
    if rng.random() < 0.3:
        settings["cp_size"] = 2
    return rows, settings


@pytest.mark.parametrize("seed", range(40))
def test_reference_is_slime_on_random_cases(slime: Any, seed: int) -> None:
    rows, settings = _random_case(seed)
    try:
        theirs = [ss.canonical(d) for d in ss.rank_dicts(slime, settings, copy.deepcopy(rows))]
    except AssertionError:
        theirs = None  # slime refuses the layout (an assert in build_dp_schedule)
    try:
        ours = [ss.canonical(d) for d in reference.slime_rank_dicts(copy.deepcopy(rows), settings)]
    except ValueError:
        ours = None
    assert ours == theirs

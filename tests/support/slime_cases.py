"""The cases slime's conversion is checked over (issue: the slime profile), shared by the
reference's differential test and the loader's: each is input rows and the project's
settings, named as slime's flags."""

from __future__ import annotations

import json
import random
from typing import Any

from tests.support.samples import sample, trajectory

Rows = list[dict[str, Any]]

DENSE = {
    "num_layers": 2,
    "hidden_size": 64,
    "ffn_hidden_size": 128,
    "num_attention_heads": 4,
    "num_query_groups": 2,
    "kv_channels": 16,
    "vocab_size": 1000,
}
MOE = {
    **DENSE,
    "num_experts": 4,
    "moe_ffn_hidden_size": 32,
    "moe_router_topk": 2,
    "moe_shared_expert_intermediate_size": 16,
}

# a shape whose per-row FLOPs pass 2**53 at a few tokens: sums round, so their order counts
GIANT = {
    "num_layers": 4096,
    "hidden_size": 65536,
    "ffn_hidden_size": 1 << 20,
    "num_attention_heads": 512,
    "num_query_groups": 64,
    "kv_channels": 128,
    "vocab_size": 1 << 20,
}


def grouped(sizes: list[int], rewards: list[float] | None = None, **fields: Any) -> Rows:
    """Prompt groups of the given sizes, one sample per index, varied lengths. (Three
    rewards of 0.9 have a float32 mean of 0.8999999: slime divides the rounding noise by
    1e-6.)"""
    rows: Rows = []
    for group, size in enumerate(sizes):
        for _ in range(size):
            i = len(rows)
            reward = rewards[i] if rewards is not None else float((i * 7) % 5) / 4
            rows.append(
                sample(i, group_index=group, reward=reward, response_length=1 + (i * 5) % 7)
            )
    for row in rows:
        row.update(fields)
    return rows


def _multi_leaf() -> Rows:
    """v2 calls of several leaves with small rollout ids (0 and 2) among singletons whose
    missing ids the fill makes 1, 3, 4, ..."""
    rows: Rows = []
    plan = [(0, 2, 0), (1, 1, None), (2, 3, 2), (3, 1, None), (4, 1, None), (5, 2, 7)]
    for index, leaves, rollout_id in plan:
        for leaf in range(leaves):
            rows.append(
                sample(
                    index,
                    leaf,
                    group_index=index // 2,
                    session_version="v2" if leaves > 1 else None,
                    rollout_id=rollout_id,
                    reward=float(index % 3),
                    response_length=2 + leaf,
                )
            )
    return rows


def _masks() -> Rows:
    rows = grouped([2, 2, 2, 2])
    rows[0]["loss_mask"] = None
    rows[1]["response_length"] = 0
    rows[1]["tokens"] = rows[1]["tokens"][:2]
    rows[1]["loss_mask"] = []
    rows[2]["loss_mask"] = [0] * rows[2]["response_length"]
    rows[3]["remove_sample"] = True
    rows[5]["remove_sample"] = True
    rows[5]["loss_mask"] = [1] * rows[5]["response_length"]
    for row in rows[4:]:
        n = row["response_length"]
        row.setdefault("loss_mask", [1, 0] * (n // 2) + [1] * (n % 2))
    return rows


def _log_probs(rows: Rows, teacher: bool = False) -> Rows:
    for position, row in enumerate(rows):
        n = row["response_length"]
        row["rollout_log_probs"] = [-0.1 * (position + k + 1) for k in range(n)]
        if teacher:
            row["teacher_log_probs"] = [-0.3 / (position + k + 1) for k in range(n)]
    return rows


def _struct(rows: Rows) -> Rows:
    for position, row in enumerate(rows):
        row["reward"] = {"score": row["reward"], "format": float(position % 2)}
    return rows


def _extras(rows: Rows) -> Rows:
    for position, row in enumerate(rows):
        row["round_number"] = position // 3
        row["raw_reward"] = 10.0 + position
        row["metadata"] = json.dumps({"source_name": "math" if position % 2 else "code"})
        row["status"] = "truncated" if position % 3 == 0 else "completed"
    return rows


def _mixed_raw_reward(rows: Rows) -> Rows:
    """raw_reward on some rows only (slime's mixed-source batches): the others take the
    reward."""
    for position, row in enumerate(rows):
        if position % 3 == 1:
            row["raw_reward"] = 5.0 + position
    return rows


def _no_group_index(rows: Rows) -> Rows:
    for row in rows:
        del row["group_index"]
    return rows


BASE = {"rollout_batch_size": 4, "n_samples_per_prompt": 2}

CASES: dict[str, tuple[Rows, dict[str, Any]]] = {
    "uneven_groups_positional": (
        grouped([3, 1, 2, 2]),
        {**BASE, "global_batch_size": 4, "dp_size": 2},
    ),
    "uneven_groups_one_group": (
        grouped([3, 1, 2, 3]),
        {**BASE, "global_batch_size": 3, "dp_size": 1},
    ),
    "multi_leaf_fill": (
        _multi_leaf(),
        {"rollout_batch_size": 3, "n_samples_per_prompt": 2, "global_batch_size": 2},
    ),
    "masks_removed_empty": (_masks(), {**BASE, "global_batch_size": 8, "dp_size": 2}),
    "log_probs": (
        _log_probs(grouped([2, 2, 2, 2]), teacher=True),
        {**BASE, "global_batch_size": 4, "dp_size": 2},
    ),
    "extras_round_raw_source": (
        _extras(grouped([2, 2, 2, 2])),
        {**BASE, "global_batch_size": 8, "dp_size": 4, "micro_batch_size": 2},
    ),
    "dp1": (grouped([2, 2, 2, 2]), {**BASE, "global_batch_size": 8}),
    "dp4_trailing_dropped": (
        grouped([2, 2, 2, 2, 2]),
        {"rollout_batch_size": 5, "n_samples_per_prompt": 2, "global_batch_size": 4, "dp_size": 4},
    ),
    "cp2_dynamic": (
        grouped([2, 2, 2, 2]),
        {
            **BASE,
            "global_batch_size": 8,
            "dp_size": 2,
            "cp_size": 2,
            "use_dynamic_batch_size": True,
            "max_tokens_per_gpu": 5,
        },
    ),
    "vpp2_static": (
        grouped([2, 2, 2, 2]),
        {
            **BASE,
            "global_batch_size": 8,
            "dp_size": 2,
            "vpp_size": 2,
            "microbatch_group_size_per_vp_stage": 2,
        },
    ),
    "vpp2_dynamic_split": (
        grouped([2, 2, 2, 2]),
        {
            **BASE,
            "global_batch_size": 8,
            "dp_size": 2,
            "vpp_size": 2,
            "microbatch_group_size_per_vp_stage": 2,
            "use_dynamic_batch_size": True,
            "max_tokens_per_gpu": 64,
        },
    ),
    "balance_fixed": (
        grouped([2, 2, 2, 2]),
        {**BASE, "global_batch_size": 8, "dp_size": 2, "balance_data": True, **DENSE},
    ),
    "balance_dynamic_moe": (
        grouped([2, 2, 2, 2]),
        {
            **BASE,
            "global_batch_size": 8,
            "dp_size": 2,
            "balance_data": True,
            "use_dynamic_batch_size": True,
            "max_tokens_per_gpu": 12,
            **MOE,
        },
    ),
    "balance_by_flops": (
        grouped([2, 2, 2, 2]),
        {
            **BASE,
            "global_batch_size": 8,
            "dp_size": 2,
            "balance_by_flops": True,
            "use_dynamic_batch_size": True,
            "max_tokens_per_gpu": 14,
            **DENSE,
        },
    ),
    "balance_giant_model_static": (
        grouped([2, 2, 2, 2, 2, 2, 2, 2]),
        {
            "rollout_batch_size": 8,
            "n_samples_per_prompt": 2,
            "global_batch_size": 16,
            "dp_size": 4,
            "balance_data": True,
            **GIANT,
        },
    ),
    "balance_by_flops_giant_model": (
        grouped([2, 2, 2, 2, 2, 2, 2, 2]),
        {
            "rollout_batch_size": 8,
            "n_samples_per_prompt": 2,
            "global_batch_size": 16,
            "dp_size": 2,
            "balance_by_flops": True,
            "use_dynamic_batch_size": True,
            "max_tokens_per_gpu": 20,
            **GIANT,
        },
    ),
    "no_normalization": (
        grouped([2, 2, 2, 2]),
        {**BASE, "global_batch_size": 8, "rewards_normalization": False},
    ),
    "no_std": (
        grouped([2, 2, 2, 2]),
        {**BASE, "global_batch_size": 8, "grpo_std_normalization": False},
    ),
    "zero_std_groups": (
        grouped([3, 3, 3], rewards=[0.9, 0.9, 0.9, 1.0, 1.0, 1.0, 0.3, 0.7, 0.3]),
        {"rollout_batch_size": 3, "n_samples_per_prompt": 3, "global_batch_size": 9},
    ),
    "ppo": (grouped([2, 2, 2, 2]), {**BASE, "global_batch_size": 8, "advantage_estimator": "ppo"}),
    "gspo": (
        grouped([2, 2, 2, 2]),
        {**BASE, "global_batch_size": 8, "advantage_estimator": "gspo"},
    ),
    "cispo": (
        grouped([2, 2, 2, 2]),
        {**BASE, "global_batch_size": 8, "advantage_estimator": "cispo"},
    ),
    "reward_key": (
        _struct(grouped([2, 2, 2, 2])),
        {**BASE, "global_batch_size": 4, "dp_size": 2, "reward_key": "score"},
    ),
    "mixed_raw_reward": (
        _mixed_raw_reward(grouped([2, 2, 2, 2])),
        {**BASE, "global_batch_size": 4, "dp_size": 2},
    ),
    "no_group_index": (
        _no_group_index(grouped([2, 2, 2, 2])),
        {**BASE, "global_batch_size": 8, "dp_size": 2},
    ),
}


def random_case(seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows and settings drawn from a seed: groups of varied sizes, multi-leaf calls with
    small ids, repeated rewards, and a random layout (some that slime refuses)."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    index = 0
    for group in range(rng.randint(2, 6)):
        for _ in range(rng.randint(1, 4)):
            leaves = rng.choice([1, 1, 1, 2, 3])
            rollout_id = rng.choice([0, 1, 2, 5]) + 10 * index if leaves > 1 else None
            reward = rng.choice([0.0, 0.5, 1.0, 0.9, 0.1])
            rows += trajectory(
                index,
                group,
                leaves,
                rollout_id,
                # per leaf, in this order: the draws of the seed's sequence
                reward=lambda leaf, first=reward: (
                    first if leaf == 0 or rng.random() < 0.7 else 0.25
                ),
                response_length=lambda leaf: rng.randint(0, 9),
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

"""The naive reference checked against SEMANTICS section 8 and torch's own float32 results."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from tests.reference import (
    reference_build,
    torch_f32_mean,
    torch_f32_std,
    torch_f32_sum,
)

# torch 2.13.0+cpu, one thread: tensor(values, dtype=float).sum(), .mean(), .std() for
# values = default_rng(n).random(n) * 10, as float.hex()
TORCH_GOLDEN = [
    (1, "0x1.4790da0000000p+2", "0x1.4790da0000000p+2", None),
    (3, "0x1.67984e0000000p+3", "0x1.df75be0000000p+1", "0x1.e2ca600000000p+1"),
    (5, "0x1.8ae1540000000p+4", "0x1.3be7760000000p+2", "0x1.a5033c0000000p+1"),
    (7, "0x1.282cca0000000p+5", "0x1.527c540000000p+2", "0x1.c288d00000000p+1"),
    (8, "0x1.67731e0000000p+5", "0x1.67731e0000000p+2", "0x1.5d7cd00000000p+1"),
    (9, "0x1.ddf42c0000000p+5", "0x1.a8d90a0000000p+2", "0x1.8edc2e0000000p+1"),
    (15, "0x1.4a1f240000000p+6", "0x1.6021380000000p+2", "0x1.9316240000000p+1"),
    (16, "0x1.4d29660000000p+6", "0x1.4d29660000000p+2", "0x1.b3a95e0000000p+1"),
    (17, "0x1.3401c00000000p+6", "0x1.21e3880000000p+2", "0x1.803c840000000p+1"),
    (31, "0x1.4151a40000000p+7", "0x1.4baf1c0000000p+2", "0x1.90c86a0000000p+1"),
    (33, "0x1.2a69140000000p+7", "0x1.215e220000000p+2", "0x1.6d80060000000p+1"),
    (63, "0x1.1dfa4c0000000p+8", "0x1.22845e0000000p+2", "0x1.67e2280000000p+1"),
    (64, "0x1.4f799a0000000p+8", "0x1.4f799a0000000p+2", "0x1.82e60c0000000p+1"),
    (65, "0x1.2ae8b80000000p+8", "0x1.264f7a0000000p+2", "0x1.9b7e280000000p+1"),
    (127, "0x1.5199960000000p+9", "0x1.54421a0000000p+2", "0x1.6db2260000000p+1"),
    (129, "0x1.440c100000000p+9", "0x1.4188fe0000000p+2", "0x1.8a398c0000000p+1"),
    (255, "0x1.36b4780000000p+10", "0x1.37ec640000000p+2", "0x1.5c4af60000000p+1"),
    (257, "0x1.3268540000000p+10", "0x1.31371c0000000p+2", "0x1.6cdf080000000p+1"),
    (511, "0x1.43e6300000000p+11", "0x1.4488740000000p+2", "0x1.7a28420000000p+1"),
    (513, "0x1.49d5c00000000p+11", "0x1.4931280000000p+2", "0x1.77a1c20000000p+1"),
    (1000, "0x1.30f8760000000p+12", "0x1.384a340000000p+2", "0x1.6cb3700000000p+1"),
    (4097, "0x1.3be0c00000000p+14", "0x1.3bcd040000000p+2", "0x1.733a5c0000000p+1"),
    (20000, "0x1.8648000000000p+16", "0x1.3fb7ea0000000p+2", "0x1.7239fa0000000p+1"),
]

# torch 2.13.0+cpu: ((t - t.mean()) / (t.std() + 1e-6)).tolist() for
# t = tensor(default_rng(100 + n).integers(0, 5, n) / 4 + 0.1, dtype=float)
NORM_GOLDEN = [
    (2, ["0x1.6a09a00000000p-1", "-0x1.6a09a40000000p-1"]),
    (3, ["0x1.ffff780000000p-1", "-0x1.ffff780000000p-24", "-0x1.ffff7c0000000p-1"]),
    (7, ["-0x1.8721580000000p+0", "0x1.e8e9b60000000p-2", "0x1.2559060000000p+0",
         "-0x1.87214e0000000p-3", "0x1.2559060000000p+0", "-0x1.87214e0000000p-3",
         "-0x1.b805840000000p-1"]),
    (8, ["-0x1.9ec4360000000p-1", "0x1.59a3860000000p+0", "0x1.59a3860000000p+0",
         "0x1.9ec43e0000000p-1", "-0x1.9ec4360000000p-1", "-0x1.9ec4360000000p-1",
         "-0x1.9ec4360000000p-1", "-0x1.1482cc0000000p-2"]),
    (13, ["-0x1.306bd80000000p-1", "-0x1.3d1b040000000p+0", "0x1.6328880000000p-1",
          "-0x1.3d1b040000000p+0", "0x1.6328880000000p-1", "-0x1.3d1b040000000p+0",
          "0x1.95e58c0000000p-5", "0x1.6328880000000p-1", "0x1.6328880000000p-1",
          "0x1.95e58c0000000p-5", "-0x1.3d1b040000000p+0", "0x1.56795a0000000p+0",
          "0x1.56795a0000000p+0"]),
]  # fmt: skip


def sample(
    index: int,
    reward: Any = 0.0,
    *,
    rollout_id: int | None = None,
    group_index: int | None = None,
    response_length: int = 2,
    loss_mask: list[int] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "index": index,
        "group_index": group_index,
        "rollout_id": rollout_id,
        "status": "completed",
        "tokens": list(range(3 + response_length)),
        "response_length": response_length,
        "loss_mask": loss_mask,
        "reward": reward,
        **extra,
    }


def flat(result: dict[str, Any], column: str) -> list[Any]:
    """A column over all ranks, in batch order."""
    rows = sorted(
        (row for rank in result["ranks"] for row in rank), key=lambda r: r["batch_position"]
    )
    return [row[column] for row in rows]


def rewards_of(rows: list[dict[str, Any]], **settings: Any) -> list[float]:
    base = {"global_batch_size": 1, "grpo_std_normalization": False}
    return flat(reference_build(rows, {**base, **settings}), "rewards")


# --- SEMANTICS 8: dynamic global batch size and trimming ----------------------------


@pytest.mark.parametrize(("rows", "expected"), [(13, 12), (16, 16)])
def test_dynamic_global_batch_size(rows: int, expected: int) -> None:
    settings = {"global_batch_size": 8, "dp_size": 4, "use_dynamic_global_batch_size": True}
    # a prompt group per row: a trim never cuts one (SEMANTICS 5.4)
    result = reference_build([sample(i, group_index=i) for i in range(rows)], settings)
    assert result["global_batch_size"] == expected
    assert result["dynamic_global_batch_size"] == expected
    assert len(flat(result, "batch_position")) == expected
    assert result["trimmed"] == rows - expected
    assert set(flat(result, "train_step")) == {0}


def test_dynamic_global_batch_size_falls_back_to_dp_and_fails() -> None:
    settings = {"global_batch_size": 8, "dp_size": 4, "use_dynamic_global_batch_size": True}
    with pytest.raises(ValueError, match="not enough samples 2 for global_batch_size 4"):
        reference_build([sample(0), sample(1)], settings)


@pytest.mark.parametrize("flag", ["disable_rollout_trim_samples", "compact"])
def test_dynamic_global_batch_size_refused_without_trimming(flag: str) -> None:
    rows = [sample(i) for i in range(8)]
    settings: dict[str, Any] = {"global_batch_size": 4, "use_dynamic_global_batch_size": True}
    if flag == "compact":
        rows[0]["rollout_id"] = rows[1]["rollout_id"] = 0
        rows[1]["index"] = 0
    else:
        settings[flag] = True
    with pytest.raises(ValueError, match="use_dynamic_global_batch_size"):
        reference_build(rows, settings)


def test_trim_keeps_whole_batches() -> None:
    rows = [sample(i, group_index=i) for i in range(11)]
    result = reference_build(rows, {"global_batch_size": 4})
    assert flat(result, "sample_indices") == list(range(8))
    assert result["trimmed"] == 3
    assert not result["is_compact"]
    assert flat(result, "train_step") == [0, 0, 0, 0, 1, 1, 1, 1]


def test_trim_cutting_a_reward_group_is_refused() -> None:
    with pytest.raises(ValueError, match="trim_cuts_reward_group"):
        reference_build([sample(i) for i in range(11)], {"global_batch_size": 4})
    rows = [sample(i, group_index=i // 3) for i in range(6)]
    with pytest.raises(ValueError, match="trim_cuts_reward_group"):
        reference_build(rows, {"global_batch_size": 4})


def test_trim_disabled_keeps_every_row() -> None:
    settings = {"global_batch_size": 4, "disable_rollout_trim_samples": True}
    result = reference_build([sample(i) for i in range(11)], settings)
    assert flat(result, "sample_indices") == list(range(11))
    assert result["trimmed"] == 0


def test_trim_fails_below_one_batch() -> None:
    with pytest.raises(ValueError, match="not enough samples 5 for global_batch_size 64"):
        reference_build([sample(i) for i in range(5)], {"global_batch_size": 64})


def test_compact_batch_is_not_trimmed() -> None:
    rows = [sample(0, rollout_id=0), sample(0, rollout_id=0), sample(1), sample(2), sample(3)]
    result = reference_build(rows, {"global_batch_size": 2})
    assert result["is_compact"]
    assert result["trimmed"] == 0
    assert flat(result, "rollout_ids") == [0, 0, 1, 2, 3]
    # the trainer takes G // dp = 2 local rows a step; the fifth row is in no whole step
    assert flat(result, "train_step") == [0, 0, 1, 1, None]
    assert result["untrained"] == 1


# --- SEMANTICS 8: loss masks and mask sums ------------------------------------------


def test_null_mask_becomes_ones() -> None:
    result = reference_build([sample(0, response_length=5)], {"global_batch_size": 1})
    assert flat(result, "loss_masks") == [[1, 1, 1, 1, 1]]


def test_remove_sample_zeroes_the_mask() -> None:
    row = sample(0, response_length=5, loss_mask=[1, 0, 1, 1, 1], remove_sample=True)
    result = reference_build([row], {"global_batch_size": 1})
    assert flat(result, "loss_masks") == [[0, 0, 0, 0, 0]]
    assert flat(result, "rollout_mask_sums") == [0]


def test_mask_of_wrong_length_is_invalid() -> None:
    row = sample(0, response_length=4, loss_mask=[1, 1])
    with pytest.raises(ValueError, match="loss mask length 2 != response length 4"):
        reference_build([row], {"global_batch_size": 1})


def test_mask_sums_per_row() -> None:
    rows = [sample(i, response_length=n) for i, n in enumerate([2, 3, 4])]
    result = reference_build(rows, {"global_batch_size": 1})
    assert flat(result, "rollout_mask_sums") == [2, 3, 4]


def test_mask_sums_shared_by_a_rollout() -> None:
    rows = [
        sample(0, rollout_id=0, response_length=2),
        sample(0, rollout_id=0, response_length=3),
        sample(1, response_length=4),
    ]
    result = reference_build(rows, {"global_batch_size": 1})
    assert flat(result, "rollout_mask_sums") == [5, 5, 4]


def test_mask_sum_counts_ones_only() -> None:
    row = sample(0, response_length=4, loss_mask=[1, 0, 1, 0])
    result = reference_build([row], {"global_batch_size": 1})
    assert flat(result, "rollout_mask_sums") == [2]


# --- SEMANTICS 8: rewards -----------------------------------------------------------


def test_rewards_grouped_by_group_index_and_rollout() -> None:
    rows = [
        sample(10, 0.0, group_index=0),
        sample(1, 1.0, rollout_id=11, group_index=0),
        sample(1, 1.0, rollout_id=11, group_index=0),
        sample(1, 1.0, rollout_id=11, group_index=0),
        sample(2, 2.0, rollout_id=20, group_index=1),
        sample(2, 2.0, rollout_id=20, group_index=1),
        sample(21, 4.0, group_index=1),
    ]
    assert rewards_of(rows) == [-0.5, 0.5, 0.5, 0.5, -1.0, -1.0, 1.0]


def test_rewards_with_std_normalization() -> None:
    rows = [sample(10, 0.0), sample(1, 1.0, rollout_id=11), sample(1, 1.0, rollout_id=11)]
    out = rewards_of(rows, grpo_std_normalization=True)
    # mean 0.5 and deviations +-0.5 are exact; std = f32(sqrt(0.5)); then + 1e-6 in float32
    expected = float(np.float32(0.5) / (np.float32(math.sqrt(0.5)) + np.float32(1e-6)))
    assert out == [-expected, expected, expected]
    assert out == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2), 1 / math.sqrt(2)], abs=2e-6)


def test_rollout_siblings_must_share_a_reward() -> None:
    rows = [sample(10, 1.0), sample(1, 2.0, rollout_id=11), sample(1, 6.0, rollout_id=11)]
    with pytest.raises(ValueError) as error:
        rewards_of(rows)
    assert str(error.value) == (
        "all samples in rollout 11 must share one reward; rows [1, 2] have rewards [2.0, 6.0]"
    )


def test_nan_siblings_do_not_share_a_reward() -> None:
    nan = float("nan")
    rows = [sample(10, 1.0), sample(1, nan, rollout_id=11), sample(1, nan, rollout_id=11)]
    with pytest.raises(ValueError, match="rollout 11 must share one reward"):
        rewards_of(rows)


def test_non_adjacent_rows_of_a_group_form_one_group() -> None:
    groups, raw = [0, 1, 0, 1], [0.0, 0.0, 2.0, 4.0]
    rows = [sample(i, raw[i], group_index=groups[i]) for i in range(4)]
    assert rewards_of(rows) == [-1.0, -2.0, 1.0, 2.0]


def test_fixed_fanout_groups_without_group_index() -> None:
    rows = [sample(i, r) for i, r in enumerate([0.0, 2.0, 10.0, 14.0])]
    assert rewards_of(rows, n_samples_per_prompt=2, rollout_batch_size=2) == [-1, 1, -2, 2]


def test_one_group_when_the_fanout_does_not_match() -> None:
    rows = [sample(i, r) for i, r in enumerate([0.0, 2.0, 4.0])]
    assert rewards_of(rows, n_samples_per_prompt=2, rollout_batch_size=2) == [-2, 0, 2]


def test_struct_reward_through_reward_key() -> None:
    rows = [
        sample(0, {"score": 2.0, "other": 9.0}, rollout_id=100),
        sample(0, {"score": 2.0, "other": 1.0}, rollout_id=100),
        sample(5, {"score": 6.0, "other": 0.0}),
    ]
    result = reference_build(
        rows, {"global_batch_size": 1, "grpo_std_normalization": False, "reward_key": "score"}
    )
    assert flat(result, "raw_reward") == [2.0, 2.0, 6.0]
    assert flat(result, "rewards") == [-2.0, -2.0, 2.0]


def test_struct_reward_missing_field_is_invalid() -> None:
    with pytest.raises(ValueError, match="no field 'score'"):
        reference_build(
            [sample(0, {"other": 1.0})], {"global_batch_size": 1, "reward_key": "score"}
        )


@pytest.mark.parametrize("estimator", ["ppo", "reinforce_plus_plus"])
def test_unnormalized_estimators_keep_the_raw_reward(estimator: str) -> None:
    raw = [0.1, 2.5, 7.0, -3.3]
    rows = [sample(i, r, group_index=0) for i, r in enumerate(raw)]
    result = reference_build(rows, {"global_batch_size": 1, "advantage_estimator": estimator})
    assert flat(result, "rewards") == raw
    assert flat(result, "raw_reward") == raw
    assert result["equal_reward_groups"] == 0


def test_rewards_normalization_off_keeps_the_raw_reward() -> None:
    raw = [0.1, 2.5]
    rows = [sample(i, r) for i, r in enumerate(raw)]
    assert rewards_of(rows, rewards_normalization=False) == raw


def test_reinforce_plus_plus_baseline_only_centres() -> None:
    rows = [sample(i, r) for i, r in enumerate([0.0, 1.0, 5.0])]
    out = rewards_of(rows, advantage_estimator="reinforce_plus_plus_baseline")
    assert out == [-2.0, -1.0, 3.0]
    assert rewards_of(rows, advantage_estimator="reinforce_plus_plus_baseline") == rewards_of(
        rows, advantage_estimator="reinforce_plus_plus_baseline", grpo_std_normalization=True
    )


def test_one_sample_per_prompt_turns_std_off() -> None:
    rows = [sample(i, r, group_index=0) for i, r in enumerate([0.0, 1.0, 5.0])]
    out = rewards_of(rows, grpo_std_normalization=True, n_samples_per_prompt=1)
    assert out == [-2.0, -1.0, 3.0]


def test_raw_reward_column_overrides_raw_reward_only() -> None:
    rows = [sample(0, 1.0, raw_reward=10.0), sample(1, 3.0, raw_reward=30.0)]
    result = reference_build(rows, {"global_batch_size": 1, "grpo_std_normalization": False})
    assert flat(result, "raw_reward") == [10.0, 30.0]
    assert flat(result, "rewards") == [-1.0, 1.0]


# --- SEMANTICS 5.3: float32 arithmetic and the Ours rule ----------------------------


def test_equal_reward_group_gives_exact_zeros() -> None:
    rows = [sample(i, 0.7, group_index=0) for i in range(7)] + [
        sample(10 + i, r, group_index=1) for i, r in enumerate([0.0, 1.0])
    ]
    result = reference_build(rows, {"global_batch_size": 1})
    assert flat(result, "rewards")[:7] == [0.0] * 7
    assert result["equal_reward_groups"] == 1


def test_torch_helpers_reproduce_the_miles_noise_for_seven_equal_rewards() -> None:
    values = [0.7] * 7
    mean = torch_f32_mean(values)
    assert mean == np.nextafter(np.float32(0.7), np.float32(0.0))
    std = torch_f32_std(values)
    assert 5e-8 < std < 7e-8
    noisy = np.float32(np.float32(0.7) - mean) / np.float32(std + np.float32(1e-6))
    assert float(noisy) == pytest.approx(0.056, abs=1e-3)


@pytest.mark.parametrize(("n", "total", "mean", "std"), TORCH_GOLDEN)
def test_torch_f32_helpers_match_torch_bitwise(
    n: int, total: str, mean: str, std: str | None
) -> None:
    values = (np.random.default_rng(n).random(n) * 10.0).tolist()
    assert float(torch_f32_sum(values)).hex() == total
    assert float(torch_f32_mean(values)).hex() == mean
    if std is not None:
        assert float(torch_f32_std(values)).hex() == std


def test_sum_order_is_not_sequential() -> None:
    # 1e8 swallows the ones one by one, but not in torch's four partial sums
    values = [1e8, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    sequential = np.float32(0.0)
    for v in values:
        sequential = np.float32(sequential + np.float32(v))
    assert sequential == np.float32(1e8)
    assert torch_f32_sum(values) == np.float32(1e8) + np.float32(3.0)


@pytest.mark.parametrize(("n", "expected"), NORM_GOLDEN)
def test_normalization_matches_torch_bitwise(n: int, expected: list[str]) -> None:
    raw = (np.random.default_rng(100 + n).integers(0, 5, n) / 4.0 + 0.1).tolist()
    rows = [sample(i, r, group_index=0) for i, r in enumerate(raw)]
    out = rewards_of(rows, grpo_std_normalization=True)
    assert [v.hex() for v in out] == expected


def test_torch_f32_sum_against_live_torch() -> None:
    import torch  # the miles extra, which make installs

    rng = np.random.default_rng(7)
    for n in [*range(1, 200), 1023, 1024, 1025, 5000]:
        values = (rng.normal(size=n) * 10.0 ** rng.integers(-3, 4, n)).tolist()
        t = torch.tensor(values, dtype=torch.float)
        assert float(torch_f32_sum(values)) == t.sum().item()
        assert float(torch_f32_mean(values)) == t.mean().item()


# --- SEMANTICS 4 and 6: columns and the strided split -------------------------------


def test_strided_split_and_columns() -> None:
    rows = [
        sample(i, float(i), group_index=i // 4, response_length=1 + i % 3, round_number=7)
        for i in range(10)
    ]
    rows[3]["status"] = "truncated"
    result = reference_build(rows, {"global_batch_size": 2, "dp_size": 2})
    assert [[r["batch_position"] for r in rank] for rank in result["ranks"]] == [
        [0, 2, 4, 6, 8],
        [1, 3, 5, 7, 9],
    ]
    assert flat(result, "train_step") == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert flat(result, "truncated") == [0, 0, 0, 1, 0, 0, 0, 0, 0, 0]
    assert flat(result, "total_lengths") == [4 + i % 3 for i in range(10)]
    assert flat(result, "response_lengths") == [1 + i % 3 for i in range(10)]
    assert flat(result, "round_number") == [7] * 10
    assert flat(result, "micro_batch") == [None] * 10
    assert "rollout_log_probs" not in result["ranks"][0][0]


def test_ranks_with_different_step_counts_are_refused() -> None:
    settings = {"global_batch_size": 3, "dp_size": 3, "disable_rollout_trim_samples": True}
    with pytest.raises(ValueError, match=r"different numbers of steps: \[4, 3, 3\]"):
        reference_build([sample(i) for i in range(10)], settings)


def test_optional_columns_all_or_none() -> None:
    rows = [
        sample(0, rollout_log_probs=[-0.5, -0.25], train_metadata='{"a": 1}'),
        sample(1, rollout_log_probs=[-1.0, -2.0], train_metadata='{"a": 2}'),
    ]
    result = reference_build(rows, {"global_batch_size": 1})
    assert flat(result, "rollout_log_probs") == [[-0.5, -0.25], [-1.0, -2.0]]
    assert flat(result, "metadata") == ['{"a": 1}', '{"a": 2}']
    rows[1]["rollout_log_probs"] = None
    with pytest.raises(ValueError, match="rollout_log_probs is set on some rows"):
        reference_build(rows, {"global_batch_size": 1})


def test_weight_versions_only_when_some_row_has_them() -> None:
    rows = [sample(0, weight_versions=[]), sample(1, weight_versions=None)]
    result = reference_build(rows, {"global_batch_size": 1})
    assert "weight_versions" not in result["ranks"][0][0]
    rows[0]["weight_versions"] = ["3"]
    result = reference_build(rows, {"global_batch_size": 1})
    assert flat(result, "weight_versions") == [["3"], None]


def test_raw_reward_column_all_or_none() -> None:
    rows = [sample(0, 1.0, raw_reward=10.0), sample(1, 3.0)]
    with pytest.raises(ValueError, match="raw_reward is set on some rows"):
        reference_build(rows, {"global_batch_size": 1})


@pytest.mark.parametrize("setting", [{"balance_data": True}, {"cp_size": 1}])
def test_out_of_scope_settings_are_refused(setting: dict[str, Any]) -> None:
    with pytest.raises(NotImplementedError):
        reference_build([sample(0)], {"global_batch_size": 1, **setting})

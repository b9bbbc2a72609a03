"""SEMANTICS.md section 8 (and the Ours rules of sections 3 to 6), with exact values."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pipeline import columns as c
from pipeline.errors import StepError, UsageError
from pipeline.settings import make_settings
from pipeline.step.plan import untrained_warning
from tests.support.samples import build, plan, ranks, sample, write_step


def batch_column(root: Path, column: str, **settings) -> list:
    frame = plan(root, **settings).frame.sort(c.BATCH_POSITION)
    return frame.get_column(column).to_list()


def rule_of(excinfo: pytest.ExceptionInfo[StepError]) -> list[str]:
    return [v.rule for v in excinfo.value.violations]


# Dynamic global batch size ---------------------------------------------------------


# The trim cases give each row a prompt group of its own (`group_index`): a trim that cuts a
# reward group, the whole batch when no row has one, is refused (SEMANTICS 5.4).
@pytest.mark.parametrize(("rows", "expected"), [(13, 12), (16, 16), (7, 4)])
def test_dynamic_global_batch_size(rows_dir: Path, rows: int, expected: int) -> None:
    write_step(rows_dir, [sample(i, group_index=i) for i in range(rows)])
    batch = plan(rows_dir, global_batch_size=4, dp_size=4, use_dynamic_global_batch_size=True)
    assert batch.meta.dynamic_global_batch_size == expected


def test_dynamic_batch_of_13_rows_on_4_ranks_keeps_12(rows_dir: Path) -> None:
    write_step(rows_dir, [sample(i, group_index=i) for i in range(13)])
    batch = plan(rows_dir, global_batch_size=4, dp_size=4, use_dynamic_global_batch_size=True)
    assert batch.meta.dynamic_global_batch_size == 12
    assert batch.meta.counts.written == 12
    assert batch.meta.num_train_steps == 1


def test_dynamic_batch_of_2_rows_on_4_ranks_fails(rows_dir: Path) -> None:
    write_step(rows_dir, [sample(i) for i in range(2)])
    with pytest.raises(StepError, match="not enough samples 2 for global_batch_size 4"):
        plan(rows_dir, global_batch_size=4, dp_size=4, use_dynamic_global_batch_size=True)


def test_dynamic_batch_refused_on_compact_batch(rows_dir: Path) -> None:
    rows = [
        sample(0, 0, session_version="v2", rollout_id=0),
        sample(0, 1, session_version="v2", rollout_id=0),
    ]
    write_step(rows_dir, rows)
    with pytest.raises(StepError) as excinfo:
        plan(rows_dir, global_batch_size=1, use_dynamic_global_batch_size=True)
    assert rule_of(excinfo) == ["dynamic_global_batch_size_on_compact"]


# Trim ------------------------------------------------------------------------------


def test_trim_11_rows_to_batches_of_4_keeps_first_8(rows_dir: Path) -> None:
    write_step(rows_dir, [sample(i, group_index=i) for i in range(11)])
    batch = plan(rows_dir, global_batch_size=4)
    assert batch_column(rows_dir, c.SAMPLE_INDICES, global_batch_size=4) == list(range(8))
    assert batch.meta.counts.to_dict() == {
        "ingested": 11,
        "quarantined": 0,
        "repaired": 0,
        "trimmed": 3,
        "dropped": 0,
        "written": 8,
        "untrained": 0,
    }
    assert batch.meta.num_train_steps == 2


def test_trim_disabled_keeps_11(rows_dir: Path) -> None:
    write_step(rows_dir, [sample(i) for i in range(11)])
    got = batch_column(
        rows_dir, c.SAMPLE_INDICES, global_batch_size=4, disable_rollout_trim_samples=True
    )
    assert got == list(range(11))


def test_trim_5_rows_for_batch_of_64_fails(rows_dir: Path) -> None:
    write_step(rows_dir, [sample(i) for i in range(5)])
    with pytest.raises(StepError, match="not enough samples 5 for global_batch_size 64"):
        plan(rows_dir, global_batch_size=64)


def test_compact_batch_is_never_trimmed(rows_dir: Path) -> None:
    rows = [
        sample(0, 0, session_version="v2", rollout_id=0),
        sample(0, 1, session_version="v2", rollout_id=0),
    ]
    rows += [sample(i, session_version="v2") for i in range(1, 4)]
    write_step(rows_dir, rows)
    batch = plan(rows_dir, global_batch_size=3)
    assert batch.meta.is_compact is True
    assert batch.meta.counts.written == 5
    # The trainer steps through local rows, G // dp = 3 at a time (SEMANTICS 6.1): one
    # whole step, and the last two rows are never trained.
    assert batch_column(rows_dir, c.TRAIN_STEP, global_batch_size=3) == [0, 0, 0, None, None]
    assert batch.meta.counts.untrained == 2
    assert batch.meta.untrained_ranks == [0]


# Loss masks ------------------------------------------------------------------------


def test_null_mask_becomes_ones_and_remove_sample_zeros(rows_dir: Path) -> None:
    rows = [sample(0, response_length=5), sample(1, response_length=5, remove_sample=True)]
    write_step(rows_dir, rows)
    assert batch_column(rows_dir, c.LOSS_MASKS, global_batch_size=2) == [[1] * 5, [0] * 5]
    assert batch_column(rows_dir, c.ROLLOUT_MASK_SUMS, global_batch_size=2) == [5, 0]


def test_mask_shorter_than_response_is_invalid(rows_dir: Path) -> None:
    write_step(rows_dir, [sample(0, response_length=4, loss_mask=[1, 1])])
    with pytest.raises(StepError) as excinfo:
        plan(rows_dir, global_batch_size=1)
    assert rule_of(excinfo) == ["loss_mask_length"]
    assert excinfo.value.violations[0].rows == [(0, 0)]


# Mask sums -------------------------------------------------------------------------


def test_mask_sums_per_row(rows_dir: Path) -> None:
    write_step(rows_dir, [sample(i, response_length=n) for i, n in enumerate((2, 3, 4))])
    assert batch_column(rows_dir, c.ROLLOUT_MASK_SUMS, global_batch_size=3) == [2, 3, 4]


def test_mask_sums_shared_by_one_rollout(rows_dir: Path) -> None:
    rows = [
        sample(0, 0, response_length=2, session_version="v2", rollout_id=0),
        sample(0, 1, response_length=3, session_version="v2", rollout_id=0),
        sample(1, 0, response_length=4, session_version="v2"),
    ]
    write_step(rows_dir, rows)
    assert batch_column(rows_dir, c.ROLLOUT_MASK_SUMS, global_batch_size=2) == [5, 5, 4]


def test_mask_sum_counts_ones_of_an_explicit_mask(rows_dir: Path) -> None:
    write_step(rows_dir, [sample(0, response_length=4, loss_mask=[1, 0, 1, 0])])
    assert batch_column(rows_dir, c.ROLLOUT_MASK_SUMS, global_batch_size=1) == [2]


# Rewards ---------------------------------------------------------------------------


def v2_rollouts(ids_and_rewards: list[tuple[int, float]], groups: list[int]) -> list[dict]:
    """Rows whose rollout keys are the given ids: repeated ids become v2 multi-leaf leaves."""
    counts: dict[int, int] = {}
    for rollout, _ in ids_and_rewards:
        counts[rollout] = counts.get(rollout, 0) + 1
    rows, leaves = [], {}
    for (rollout, reward), group in zip(ids_and_rewards, groups, strict=True):
        leaf = leaves.get(rollout, 0)
        leaves[rollout] = leaf + 1
        multi = counts[rollout] > 1
        rows.append(
            sample(
                rollout,
                leaf,
                reward=reward,
                group_index=group,
                session_version="v2",
                rollout_id=rollout if multi else None,
            )
        )
    return rows


def test_rewards_centred_per_group_without_std(rows_dir: Path) -> None:
    ids = [(10, 0), (11, 1), (11, 1), (11, 1), (20, 2), (20, 2), (21, 4)]
    write_step(rows_dir, v2_rollouts(ids, [0, 0, 0, 0, 1, 1, 1]))
    got = batch_column(rows_dir, c.REWARDS, global_batch_size=1, grpo_std_normalization=False)
    assert got == [-0.5, 0.5, 0.5, 0.5, -1.0, -1.0, 1.0]
    raw = batch_column(rows_dir, c.RAW_REWARD, global_batch_size=1, grpo_std_normalization=False)
    assert raw == [0.0, 1.0, 1.0, 1.0, 2.0, 2.0, 4.0]


def test_rewards_with_std(rows_dir: Path) -> None:
    write_step(rows_dir, v2_rollouts([(10, 0), (11, 1), (11, 1)], [0, 0, 0]))
    got = batch_column(rows_dir, c.REWARDS, global_batch_size=1)
    # miles divides by (std + 1e-6): 1/sqrt(2) to within the epsilon.
    half = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert abs(half - 1 / math.sqrt(2)) < 2e-6
    for value, want in zip(got, [-half, half, half], strict=True):
        assert abs(value - want) <= 1e-6 * max(1, abs(want))


def test_siblings_with_different_rewards_are_invalid(rows_dir: Path) -> None:
    write_step(rows_dir, v2_rollouts([(10, 1), (11, 2), (11, 6)], [0, 0, 0]))
    with pytest.raises(StepError) as excinfo:
        plan(rows_dir, global_batch_size=1)
    (violation,) = excinfo.value.violations
    assert violation.rule == "rollout_shares_reward"
    assert violation.message == (
        "all samples in rollout 11 must share one reward; rows [1, 2] have rewards [2.0, 6.0]; "
        "--on-invalid quarantine would set these trajectories aside and build the rest"
    )
    assert violation.rows == [(11, 0), (11, 1)]


def test_siblings_may_differ_when_rewards_are_not_normalized(rows_dir: Path) -> None:
    write_step(rows_dir, v2_rollouts([(10, 1), (11, 2), (11, 6)], [0, 0, 0]))
    got = batch_column(rows_dir, c.REWARDS, global_batch_size=1, advantage_estimator="ppo")
    assert got == [1.0, 2.0, 6.0]


def test_non_adjacent_rows_of_a_group_form_one_group(rows_dir: Path) -> None:
    rows = [
        sample(i, group_index=g, reward=r)
        for i, (g, r) in enumerate(zip([0, 1, 0, 1], [0, 0, 2, 4], strict=True))
    ]
    write_step(rows_dir, rows)
    got = batch_column(rows_dir, c.REWARDS, global_batch_size=1, grpo_std_normalization=False)
    assert got == [-1.0, -2.0, 1.0, 2.0]


@pytest.mark.parametrize(
    ("rewards", "expected"),
    [
        # rollout_batch_size x n_samples_per_prompt rows: runs of n_samples_per_prompt
        ([0, 2, 10, 14], [-1.0, 1.0, -2.0, 2.0]),
        # any other count: one group of the whole batch
        ([0, 2, 4], [-2.0, 0.0, 2.0]),
    ],
    ids=["fixed_fanout_groups_without_group_index", "one_group_when_fanout_does_not_match"],
)
def test_fanout_groups(rows_dir: Path, rewards: list[int], expected: list[float]) -> None:
    write_step(rows_dir, [sample(i, reward=r) for i, r in enumerate(rewards)])
    got = batch_column(
        rows_dir,
        c.REWARDS,
        global_batch_size=1,
        grpo_std_normalization=False,
        n_samples_per_prompt=2,
        rollout_batch_size=2,
    )
    assert got == expected


def test_struct_reward_through_reward_key(rows_dir: Path) -> None:
    rows = [
        sample(0, 0, session_version="v2", rollout_id=0, reward={"score": 2.0, "format": 1.0}),
        sample(0, 1, session_version="v2", rollout_id=0, reward={"score": 2.0, "format": 0.0}),
        sample(1, 0, session_version="v2", reward={"score": 6.0, "format": 1.0}),
    ]
    write_step(rows_dir, rows)
    settings = {"global_batch_size": 1, "grpo_std_normalization": False, "reward_key": "score"}
    assert batch_column(rows_dir, c.RAW_REWARD, **settings) == [2.0, 2.0, 6.0]
    assert batch_column(rows_dir, c.REWARDS, **settings) == [-2.0, -2.0, 2.0]


def test_struct_reward_without_reward_key_is_refused(rows_dir: Path) -> None:
    write_step(rows_dir, [sample(0, reward={"score": 2.0})])
    with pytest.raises(StepError) as excinfo:
        plan(rows_dir, global_batch_size=1)
    assert rule_of(excinfo) == ["reward_key"]


def test_ppo_rewards_equal_raw(rows_dir: Path) -> None:
    write_step(rows_dir, [sample(i, reward=r, group_index=0) for i, r in enumerate([0.5, 2, 3])])
    assert batch_column(rows_dir, c.REWARDS, global_batch_size=1, advantage_estimator="ppo") == [
        0.5,
        2.0,
        3.0,
    ]


def test_equal_reward_group_is_exactly_zero_and_counted(rows_dir: Path) -> None:
    write_step(rows_dir, [sample(i, reward=0.7, group_index=0) for i in range(7)])
    batch = plan(rows_dir, global_batch_size=7)
    assert batch.frame.get_column(c.REWARDS).to_list() == [0.0] * 7
    assert batch.meta.equal_reward_groups == 1


def test_raw_reward_column_overrides_written_raw_reward(rows_dir: Path) -> None:
    rows = [
        sample(0, reward=1.0, raw_reward=0.25, group_index=0),
        sample(1, reward=0.0, raw_reward=0.5, group_index=0),
    ]
    write_step(rows_dir, rows)
    assert batch_column(rows_dir, c.RAW_REWARD, global_batch_size=2) == [0.25, 0.5]
    assert batch_column(rows_dir, c.REWARDS, global_batch_size=2, grpo_std_normalization=False) == [
        0.5,
        -0.5,
    ]


# Data-parallel split ---------------------------------------------------------------


def test_strided_split(rows_dir: Path, tmp_path: Path) -> None:
    write_step(rows_dir, [sample(i, response_length=1 + i, group_index=i) for i in range(10)])
    build(rows_dir, tmp_path / "out", global_batch_size=3, dp_size=3)
    got = [r.get_column(c.BATCH_POSITION).to_list() for r in ranks(tmp_path / "out")]
    assert got == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]


# How the trainer steps through a rank (SEMANTICS 6.1) ------------------------------


def test_plain_trimmed_step_k_holds_positions_k_g_to_next(rows_dir: Path) -> None:
    write_step(rows_dir, [sample(i) for i in range(8)])
    frame = plan(rows_dir, global_batch_size=4, dp_size=2).frame
    by_position = frame.sort(c.BATCH_POSITION).get_column(c.TRAIN_STEP).to_list()
    assert by_position == [0, 0, 0, 0, 1, 1, 1, 1]


def test_balanced_step_mixes_positions_as_the_trainer_does(rows_dir: Path) -> None:
    lengths = [9, 1, 8, 2, 7, 3, 6, 4]
    write_step(rows_dir, [sample(i, response_length=n) for i, n in enumerate(lengths)])
    frame = plan(rows_dir, global_batch_size=4, dp_size=2, balance_data=True).frame
    for rank in (0, 1):
        rows = frame.filter(frame[c.RANK] == rank)
        assert rows.get_column(c.TRAIN_STEP).to_list() == [0, 0, 1, 1]
    assert frame.get_column(c.TRAIN_STEP).null_count() == 0


def test_untrained_rows_are_counted_and_warned(rows_dir: Path, tmp_path: Path) -> None:
    # trimming off, 10 rows on 2 ranks of 5, G 4 -> 2 rows a step: rows 8 and 9 never train
    write_step(rows_dir, [sample(i) for i in range(10)])
    settings = {"global_batch_size": 4, "dp_size": 2, "disable_rollout_trim_samples": True}
    batch = plan(rows_dir, **settings)
    assert batch.meta.counts.untrained == 2
    assert batch.meta.untrained_ranks == [0, 1]
    assert batch.meta.num_train_steps == 2
    frame = batch.frame
    assert frame.filter(frame[c.TRAIN_STEP].is_null()).get_column(c.BATCH_POSITION).to_list() == [
        8,
        9,
    ]
    warning = untrained_warning(batch.meta)
    assert warning is not None
    assert warning.startswith("step 1: warning: 2 rows on ranks [0, 1] are never trained")
    assert "cp_size" in warning


def test_ranks_running_different_step_counts_are_refused(rows_dir: Path) -> None:
    write_step(rows_dir, [sample(i) for i in range(10)])
    with pytest.raises(StepError) as excinfo:
        plan(rows_dir, global_batch_size=3, dp_size=3, disable_rollout_trim_samples=True)
    assert rule_of(excinfo) == ["ranks_run_different_steps"]
    message = str(excinfo.value)
    assert "[4, 3, 3]" in message
    assert "ranks [0]" in message
    assert "cp_size" in message
    assert excinfo.value.violations[0].rows == [(9, 0)]


def test_untrained_rows_with_dynamic_batch_size_are_refused(rows_dir: Path) -> None:
    write_step(rows_dir, [sample(i) for i in range(5)])
    with pytest.raises(StepError) as excinfo:
        plan(
            rows_dir,
            global_batch_size=2,
            disable_rollout_trim_samples=True,
            use_dynamic_batch_size=True,
            max_tokens_per_gpu=100,
        )
    assert rule_of(excinfo) == ["untrained_rows_with_dynamic_batch_size"]
    assert "1 rows on ranks [0]" in str(excinfo.value)
    assert excinfo.value.violations[0].rows == [(4, 0)]


def test_global_batch_size_not_divisible_by_dp_size_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="global_batch_size=5 must be divisible by dp_size=2"):
        make_settings({"global_batch_size": 5, "dp_size": 2})


def test_shard_columns_and_types(rows_dir: Path, tmp_path: Path) -> None:
    rows = [
        sample(
            3,
            status="truncated",
            response_length=2,
            rollout_log_probs=[-0.5, -0.25],
            round_number=4,
            train_metadata='{"a": 1}',
            weight_versions=["w1"],
        ),
        sample(
            4,
            response_length=2,
            rollout_log_probs=[-1.0, -2.0],
            round_number=4,
            train_metadata='{"a": 2}',
            weight_versions=[],
        ),
    ]
    write_step(rows_dir, rows)
    build(rows_dir, tmp_path / "out", global_batch_size=2, advantage_estimator="ppo")
    (shard,) = ranks(tmp_path / "out")
    assert shard.columns == [
        *c.SHARD_COLUMNS,
        "rollout_log_probs",
        "teacher_log_probs",
        "rollout_sampling_mask_ids",
        "rollout_sampling_mask_offsets",
        "weight_versions",
        "weight_version_spans",
        "round_number",
        "metadata",
        "step",
        "rank",
    ]
    manifest = json.loads((tmp_path / "out" / "step=1" / "manifest.json").read_text())
    assert manifest["present_columns"] == [
        "rollout_log_probs",
        "weight_versions",
        "round_number",
        "metadata",
    ]
    assert shard.row(0, named=True) | {"tokens": None} == {
        "batch_position": 0,
        "train_step": 0,
        "micro_batch": None,
        "tokens": None,
        "response_lengths": 2,
        "total_lengths": 4,
        "loss_masks": [1, 1],
        "rewards": 0.0,
        "raw_reward": 0.0,
        "truncated": 1,
        "sample_indices": 3,
        "rollout_ids": 3,
        "rollout_mask_sums": 2,
        "rollout_log_probs": [-0.5, -0.25],
        "teacher_log_probs": None,
        "rollout_sampling_mask_ids": None,
        "rollout_sampling_mask_offsets": None,
        "weight_versions": ["w1"],
        "weight_version_spans": None,
        "round_number": 4,
        "metadata": '{"a": 1}',
        "step": 1,
        "rank": 0,
    }
    assert dict(shard.schema) == c.DATASET_SCHEMA
    assert str(shard.schema["tokens"]) == "List(Int32)"
    assert str(shard.schema["loss_masks"]) == "List(Int8)"
    assert str(shard.schema["truncated"]) == "Int8"


def test_rewards_match_torch_bit_for_bit(rows_dir: Path) -> None:
    import numpy as np
    import torch

    raw = (np.random.default_rng(3).integers(0, 9, 37) / 8.0 + 0.1).tolist()
    write_step(rows_dir, [sample(i, reward=r, group_index=0) for i, r in enumerate(raw)])
    got = batch_column(rows_dir, c.REWARDS, global_batch_size=1)
    t = torch.tensor(raw, dtype=torch.float)
    want = ((t - t.mean()) / (t.std() + 1e-6)).tolist()
    assert [v.hex() for v in got] == [float(v).hex() for v in want]


def test_seven_equal_rewards_are_zero_where_miles_gives_noise(rows_dir: Path) -> None:
    import torch

    t = torch.tensor([0.7] * 7, dtype=torch.float)
    miles = ((t - t.mean()) / (t.std() + 1e-6)).tolist()
    assert all(abs(v - 0.056) < 0.01 for v in miles)  # SEMANTICS 5.3: miles' noise
    write_step(rows_dir, [sample(i, reward=0.7, group_index=0) for i in range(7)])
    assert batch_column(rows_dir, c.REWARDS, global_batch_size=7) == [0.0] * 7


@pytest.mark.parametrize("compact", [False, True])
@pytest.mark.parametrize("order", ["together", "groups interleaved", "leaves interleaved"])
def test_rewards_match_torch_per_group_whichever_order_the_rows_come_in(
    rows_dir: Path, order: str, compact: bool
) -> None:
    """Groups of 1 to 9 rollouts with std normalization: each row gets its rollout's group's
    torch result, the group's rollout rewards summed in order of first appearance. With
    each rollout's rows and each group's rows together (compact: rollouts of 1 to 3 leaves),
    the plan takes the first row of each run as the rollout, without grouping; with the
    groups or a group's leaves interleaved, it groups first. Both give torch's bits."""
    import numpy as np
    import polars as pl
    import torch

    from pipeline.columns import GROUP
    from pipeline.trainers.miles.rewards import _rollouts_are_runs

    rng = np.random.default_rng(7)
    groups = [g for g, size in enumerate([1, 2, 3, 5, 8, 9, 4, 7, 3]) for _ in range(size)]
    rewards = [float(rng.integers(0, 9)) / 8.0 + 0.1 for _ in groups]
    rewards[-3:] = [0.35] * 3  # a group of equal rewards
    leaves = [1 + k % 3 if compact else 1 for k in range(len(groups))]
    # one entry per row: (rollout, leaf); a rollout's leaves stay together unless interleaved
    rows = [(k, leaf) for k in range(len(groups)) for leaf in range(leaves[k])]
    if order == "groups interleaved":
        rows = sorted(rows, key=lambda row: (row[0] % 3, row))
    if order == "leaves interleaved":  # within each group: every first leaf, then seconds
        rows = sorted(rows, key=lambda row: (groups[row[0]], row[1], row[0]))
    write_step(
        rows_dir,
        [
            sample(
                k,
                leaf,
                reward=rewards[k],
                group_index=groups[k],
                session_version="v2",
                rollout_id=k if leaves[k] > 1 else None,
            )
            for k, leaf in rows
        ],
    )
    got = batch_column(rows_dir, c.REWARDS, global_batch_size=1)
    rollout_order = list(dict.fromkeys(k for k, _ in rows))  # by first appearance
    want: dict[int, float] = {}
    for group in set(groups):
        members = [k for k in rollout_order if groups[k] == group]
        t = torch.tensor([rewards[k] for k in members], dtype=torch.float)
        if len(members) == 1 or bool((t == t[0]).all()):
            values = [0.0] * len(members)
        else:
            values = ((t - t.mean()) / (t.std() + 1e-6)).tolist()
        want |= dict(zip(members, values, strict=True))
    keys = pl.LazyFrame({GROUP: [groups[k] for k, _ in rows], c.ROLLOUT_KEY: [k for k, _ in rows]})
    runs = order == "together" or (order == "leaves interleaved" and not compact)
    assert _rollouts_are_runs(keys) is runs
    assert [v.hex() for v in got] == [float(want[k]).hex() for k, _ in rows]

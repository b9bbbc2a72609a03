"""The rollout metrics of a step against a per-sample computation of miles' definitions
(tests/reference.py, and below miles' newer ones: episode rewards and lengths, training
samples, pass@k), and the alarms `build` prints."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, assume, given, reject, settings
from hypothesis import strategies as st

from pipeline import columns as c
from pipeline.errors import StepError
from pipeline.manifest import Manifest
from pipeline.step.build import alarm_lines
from pipeline.transforms import metrics as m
from pipeline.transforms.metrics import rollout_metrics
from tests.reference import (
    compute_statistics,
    effective_response_length,
    effective_settings,
    get_reward_value,
    reference_metrics,
)
from tests.support.samples import build, plan, sample, write_step

REWARDS = [0.0, 1.0, 0.5, 0.25, 0.35, -0.35, 0.7, 1e-9]
VERSIONS = [[], ["3"], ["4"], ["3", "4"], ["w3"], ["w3", "w4"], ["12", "9"]]


@st.composite
def steps(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Trajectories in index order; with `compact`, some are v2 multi-leaf rollouts (one
    rollout_id, one reward, raw rewards and lengths of their own per leaf)."""
    n = draw(st.integers(1, 10))
    with_groups = draw(st.booleans())
    with_raw = draw(st.booleans())
    with_versions = draw(st.booleans())
    compact = draw(st.booleans())
    with_removed = draw(st.booleans())
    rows = []
    for i in range(n):
        leaves = draw(st.integers(1, 3)) if compact else 1
        reward = draw(st.sampled_from(REWARDS))
        group = draw(st.integers(0, 3)) if with_groups else None
        for leaf in range(leaves):
            response = draw(st.integers(0, 6))
            fields: dict[str, Any] = {
                "response_length": response,
                "reward": reward,
                "status": draw(st.sampled_from(["completed", "truncated", "aborted"])),
            }
            if response and draw(st.booleans()):
                mask = st.lists(st.integers(0, 1), min_size=response, max_size=response)
                fields["loss_mask"] = draw(mask)
            if with_groups:
                # leaves of one rollout in two prompt groups count as two rollouts in miles
                fields["group_index"] = group if draw(st.booleans()) else group + leaf
            if with_raw:
                fields["raw_reward"] = draw(st.sampled_from(REWARDS))
            if with_versions:
                fields["weight_versions"] = draw(st.sampled_from(VERSIONS))
            if with_removed:
                fields["remove_sample"] = draw(st.booleans())
            if compact:
                fields["session_version"] = "v2"
                # rollout ids apart from every index: a key belongs to one trajectory
                fields["rollout_id"] = 100 + i if leaves > 1 else None
            rows.append(sample(i, leaf, **fields))
    return rows


def miles_episode_metrics(rows: list[dict[str, Any]], chosen: dict[str, Any]) -> dict[str, float]:
    """miles' `_compute_training_sample_metrics` and `_compute_episode_response_length_metrics`
    per sample: a dict per rollout key in order of first appearance."""
    reward_key = effective_settings(chosen)["reward_key"]
    lengths: dict[tuple[Any, ...], int] = {}
    totals: dict[tuple[Any, ...], int] = {}
    rewards: dict[tuple[Any, ...], list[float]] = {}
    for position, row in enumerate(rows):
        if row.get("rollout_id") is not None:
            key: tuple[Any, ...] = ("rollout", row.get("group_index"), row["rollout_id"])
        else:
            key = ("sample", row.get("group_index"), row["index"])
        effective = 0 if row.get("remove_sample") else effective_response_length(row)
        lengths[key] = lengths.get(key, 0) + effective
        totals[key] = totals.get(key, 0) + row["response_length"]
        raw = row.get("raw_reward")
        raw = get_reward_value(row, position, reward_key) if raw is None else raw
        rewards.setdefault(key, []).append(raw)
    per_rollout = [sum(values) / len(values) for values in rewards.values()]
    stats = {
        "rollout/num_training_samples": float(len(rows)),
        "rollout/episode_raw_reward": sum(per_rollout) / len(per_rollout),
        "rollout/episode_total_response_length/mean": np.mean(list(totals.values())).item(),
    }
    for name, value in compute_statistics(list(lengths.values())).items():
        stats[f"rollout/episode_response_length/{name}"] = value
    return stats


def miles_passrate(rows: list[dict[str, Any]], chosen: dict[str, Any]) -> dict[str, float]:
    """miles' `_compute_passrate_from_samples` with `compute_pass_rate`, per sample."""
    merged = effective_settings(chosen)
    size = merged["n_samples_per_prompt"]
    if size is None or size <= 1:
        return {}
    groups: dict[Any, list[float]] = {}
    for position, row in enumerate(rows):
        reward = get_reward_value(row, position, merged["reward_key"])
        groups.setdefault(row.get("group_index"), []).append(reward)
    complete = [group for group in groups.values() if len(group) == size]
    if not complete:
        return {}
    rewards = np.array([r for group in complete for r in group]).reshape(len(complete), size)
    stats = {}
    for k in [2**i for i in range(int(math.log2(size)) + 1)]:
        estimates = [
            1.0 if size - c < k else 1.0 - np.prod(1.0 - k / np.arange(size - c + 1, size + 1))
            for c in np.sum(rewards == 1, axis=1)
        ]
        stats[f"passrate/pass@{k}"] = np.mean(estimates).item()
    return stats


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=steps(),
    dp_size=st.integers(1, 3),
    estimator=st.sampled_from(["grpo", "ppo"]),
    trim=st.booleans(),
    group_size=st.sampled_from([None, 2, 3, 4]),
)
def test_metrics_match_miles_definitions(
    rows: list[dict[str, Any]], dp_size: int, estimator: str, trim: bool, group_size: int | None
) -> None:
    chosen = {
        "global_batch_size": dp_size,
        "dp_size": dp_size,
        "advantage_estimator": estimator,
        "disable_rollout_trim_samples": not trim,
        "n_samples_per_prompt": group_size,
    }
    assume(len(rows) >= dp_size)
    with tempfile.TemporaryDirectory() as tmp:
        write_step(Path(tmp), rows)
        try:
            batch = plan(Path(tmp), **chosen)
        except StepError:  # settings this batch cannot train with (SEMANTICS 6.1)
            reject()
    counts = batch.meta.counts
    assert counts.quarantined == 0
    # miles logs the batch after the trim (`postprocess_rollout_data`)
    kept = rows[: counts.ingested - counts.trimmed]
    want = reference_metrics(kept, chosen, untrained=counts.untrained)
    want |= miles_episode_metrics(kept, chosen)
    passrate = miles_passrate(kept, chosen)
    want |= passrate
    want["rollout/step"] = 1.0
    got = batch.meta.stats
    assert set(got) == set(want)
    for name, value in want.items():
        if name in passrate:
            # numpy multiplies and sums in its own order (pairwise sums), Polars in another
            assert math.isclose(got[name], value, rel_tol=1e-12, abs_tol=1e-15), name
        else:
            # bit for bit: the same float operations in the same order
            assert got[name].hex() == float(value).hex(), name


def test_worked_step_metrics(rows_dir: Path, tmp_path: Path) -> None:
    """Two prompt groups: one all 0 (zero std), one mixed; one truncated row of four."""
    rows = [
        sample(0, group_index=0, reward=0.0, response_length=3, loss_mask=[1, 0, 1]),
        sample(1, group_index=0, reward=0.0, response_length=4, status="truncated"),
        sample(2, group_index=1, reward=1.0, response_length=2, weight_versions=["3", "4"]),
        sample(3, group_index=1, reward=0.0, response_length=6, weight_versions=["5"]),
    ]
    write_step(rows_dir, rows)
    manifest = build(rows_dir, tmp_path / "out", global_batch_size=2, dp_size=2)
    on_disk = json.loads((tmp_path / "out" / "step=1" / "manifest.json").read_text())
    assert on_disk["stats"] == manifest["stats"]
    assert manifest["stats"] == {
        # one row per rollout: the episode figures are the row figures
        "rollout/num_training_samples": 4.0,
        "rollout/episode_response_length/mean": 3.5,
        "rollout/episode_response_length/median": 3.0,
        "rollout/episode_response_length/max": 6.0,
        "rollout/episode_response_length/min": 2.0,
        "rollout/episode_total_response_length/mean": 3.75,  # response lengths 3, 4, 2, 6
        "rollout/episode_raw_reward": 0.25,
        "rollout/response_len/mean": 3.5,  # effective lengths 2, 4, 2, 6
        "rollout/response_len/median": 3.0,
        "rollout/response_len/max": 6.0,
        "rollout/response_len/min": 2.0,
        "rollout/zero_std/count_0.0": 1.0,
        "rollout/zero_std/all_zero_percentage": 0.5,
        "rollout/zero_std/all_one_percentage": 0.0,
        "zero_std_ratio": 0.5,
        "rollout/truncated_ratio": 0.25,
        "rollout/raw_reward": 0.25,
        "rollout/weight_version/mean": 4.0,  # oldest versions 3 and 5
        "rollout/weight_version/median": 4.0,
        "rollout/weight_version/max": 5.0,
        "rollout/weight_version/min": 3.0,
        "rollout/weight_version/mixed_version_ratio": 0.25,
        "rollout/step": 1.0,
        "untrained_ratio": 0.0,
        # rank 0 gets rows 0 and 2 (5 + 4 tokens), rank 1 rows 1 and 3 (6 + 8 tokens)
        "rank_tokens/max_over_mean": 14 / 11.5,
    }


def test_worked_compact_step_metrics(rows_dir: Path, tmp_path: Path) -> None:
    """A v2 rollout split into two samples counts once in the episode figures: its raw
    rewards averaged, its trainable lengths summed (the removed sample's count 0), its
    response lengths summed; every sample counts in `num_training_samples`."""
    rows = [
        sample(0, 0, group_index=0, reward=1.0, raw_reward=1.0, response_length=3,
               loss_mask=[1, 1, 0], session_version="v2", rollout_id=10),
        sample(0, 1, group_index=0, reward=1.0, raw_reward=0.0, response_length=4,
               remove_sample=True, session_version="v2", rollout_id=10),
        sample(1, group_index=0, reward=0.0, response_length=2, session_version="v2"),
        sample(2, group_index=1, reward=1.0, response_length=5, session_version="v2"),
        sample(3, group_index=1, reward=0.0, response_length=1, session_version="v2"),
    ]  # fmt: skip
    write_step(rows_dir, rows, step=7)
    manifest = build(rows_dir, tmp_path / "out", global_batch_size=4, n_samples_per_prompt=2)
    stats = manifest["stats"]
    assert stats["rollout/step"] == 7.0
    assert stats["rollout/num_training_samples"] == 5.0
    # rollouts: (1.0 + 0.0) / 2, 0.0, 1.0, 0.0
    assert stats["rollout/episode_raw_reward"] == 0.375
    assert stats["rollout/raw_reward"] == 0.4  # rows: 1.0, 0.0, 0.0, 1.0, 0.0
    # trainable lengths per rollout: 2 + 0, 2, 5, 1
    assert stats["rollout/episode_response_length/mean"] == 2.5
    assert stats["rollout/episode_response_length/median"] == 2.0
    assert stats["rollout/episode_response_length/max"] == 5.0
    assert stats["rollout/episode_response_length/min"] == 1.0
    assert stats["rollout/episode_total_response_length/mean"] == 3.75  # 7, 2, 5, 1
    # response_len counts the removed sample's mask (miles reads it before the conversion)
    assert stats["rollout/response_len/mean"] == (2 + 4 + 2 + 5 + 1) / 5
    # group 0 has 3 samples, not n_samples_per_prompt (2): only group 1 counts, 1 of 2 right
    assert stats["passrate/pass@1"] == 0.5
    assert stats["passrate/pass@2"] == 1.0


def test_pass_at_k_by_hand() -> None:
    """Groups of 4 with 1 and 2 right answers; a group of 3 is incomplete and left out.
    pass@k of a group is 1 - C(n - c, k) / C(n, k)."""
    frame = pl.LazyFrame(
        {
            "index": list(range(11)),
            "group_index": [0] * 4 + [1] * 4 + [2] * 3,
            "status": ["completed"] * 11,
            "response_length": [1] * 11,
            "reward": [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0],
        }
    )
    stats = rollout_metrics(frame, pl.col("reward"), "grpo", n_samples_per_prompt=4)
    # group 0: 1 - 3/4, 1 - 3/6, 1; group 1: 1 - 2/4, 1 - 1/6, 1
    assert stats["passrate/pass@1"] == pytest.approx((0.25 + 0.5) / 2, rel=1e-15)
    assert stats["passrate/pass@2"] == pytest.approx((0.5 + 5 / 6) / 2, rel=1e-15)
    assert stats["passrate/pass@4"] == 1.0
    assert not any(name.startswith("passrate/") for name in rollout_metrics(
        frame, pl.col("reward"), "grpo", n_samples_per_prompt=1))  # fmt: skip
    assert "passrate/pass@1" not in rollout_metrics(
        frame, pl.col("reward"), "grpo", n_samples_per_prompt=5
    )  # no group of 5


@pytest.mark.parametrize(
    ("rewards", "statuses", "alarms"),
    [
        ([0.0, 1.0, 0.0, 1.0], ["completed"] * 4, []),
        ([0.0, 0.0, 1.0, 1.0], ["completed"] * 4, ["zero reward std"]),
        ([0.0, 1.0, 0.0, 1.0], ["truncated", *["completed"] * 3], ["truncated"]),
    ],
)
def test_alarming_metrics_get_a_line(
    rows_dir: Path, tmp_path: Path, rewards: list[float], statuses: list[str], alarms: list[str]
) -> None:
    rows = [
        sample(i, group_index=i // 2, reward=r, status=s)
        for i, (r, s) in enumerate(zip(rewards, statuses, strict=True))
    ]
    write_step(rows_dir, rows)
    built = build(rows_dir, tmp_path / "out", global_batch_size=4)
    manifest = Manifest.from_json(json.dumps(built))
    lines = alarm_lines(manifest)
    assert len(lines) == len(alarms)
    for line, alarm in zip(lines, alarms, strict=True):
        assert line.startswith("step 1: warning: ") and alarm in line


@settings(max_examples=200, deadline=None)
@given(
    rollouts=st.lists(
        st.tuples(
            st.one_of(st.none(), st.integers(0, 2)),  # group index
            st.lists(
                st.one_of(
                    st.sampled_from([0.0, -0.0, 1.0, 0.1, 0.2, 0.3, 1e16, -1e16]),
                    st.floats(-2.0, 2.0),
                ),
                min_size=1,
                max_size=4,
            ),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_episode_rewards_are_running_sums_of_each_rollout(
    rollouts: list[tuple[int | None, list[float]]],
) -> None:
    """The episode raw reward of each rollout is the last value of its rewards' running
    sum (Polars' `cum_sum`, from 0.0) over its size, bit for bit, whatever its size,
    rounding and group (null being one)."""
    rows = [
        {m._ID: key, c.GROUP_INDEX: group, m._RAW: reward}
        for key, (group, rewards) in enumerate(rollouts)
        for reward in rewards
    ]
    values = pl.DataFrame(
        rows, schema={m._ID: pl.Int64, c.GROUP_INDEX: pl.Int64, m._RAW: pl.Float64}
    ).with_columns(
        pl.lit(1, dtype=pl.Int64).alias(m._EFFECTIVE_LENGTH),
        pl.lit(False).alias(m._REMOVED),
        pl.lit(1, dtype=pl.Int64).alias(m._RESPONSE),
    )
    running = values.group_by(c.GROUP_INDEX, m._ID, maintain_order=True).agg(
        (pl.col(m._RAW).cum_sum().last() / pl.len()).alias("episode")
    )
    want = running.select(
        (pl.col("episode").cum_sum().last() / pl.len()).alias(m.EPISODE_RAW_REWARD)
    ).item()
    assert m._episode_metrics(values)[m.EPISODE_RAW_REWARD].hex() == want.hex()

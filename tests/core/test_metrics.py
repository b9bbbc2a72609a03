"""The rollout metrics of a step against a per-sample computation of miles' definitions
(tests/reference.py), and the alarms `build` prints."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pipeline.manifest import Manifest
from pipeline.step.build import alarm_lines
from tests.conftest import build, plan, sample, write_step
from tests.reference import reference_metrics

REWARDS = [0.0, 1.0, 0.5, 0.25, 0.35, -0.35, 0.7, 1e-9]
VERSIONS = [[], ["3"], ["4"], ["3", "4"], ["w3"], ["w3", "w4"], ["12", "9"]]


@st.composite
def steps(draw: st.DrawFn) -> list[dict[str, Any]]:
    n = draw(st.integers(1, 14))
    with_groups = draw(st.booleans())
    with_raw = draw(st.booleans())
    with_versions = draw(st.booleans())
    rows = []
    for i in range(n):
        response = draw(st.integers(0, 6))
        fields: dict[str, Any] = {
            "response_length": response,
            "reward": draw(st.sampled_from(REWARDS)),
            "status": draw(st.sampled_from(["completed", "truncated", "aborted"])),
        }
        if response and draw(st.booleans()):
            mask = st.lists(st.integers(0, 1), min_size=response, max_size=response)
            fields["loss_mask"] = draw(mask)
        if with_groups:
            fields["group_index"] = draw(st.integers(0, 3))
        if with_raw:
            fields["raw_reward"] = draw(st.sampled_from(REWARDS))
        if with_versions:
            fields["weight_versions"] = draw(st.sampled_from(VERSIONS))
        rows.append(sample(i, **fields))
    return rows


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=steps(),
    dp_size=st.integers(1, 3),
    estimator=st.sampled_from(["grpo", "ppo"]),
    trim=st.booleans(),
)
def test_metrics_match_miles_definitions(
    rows: list[dict[str, Any]], dp_size: int, estimator: str, trim: bool
) -> None:
    chosen = {
        "global_batch_size": dp_size,
        "dp_size": dp_size,
        "advantage_estimator": estimator,
        "disable_rollout_trim_samples": not trim,
    }
    assume(len(rows) >= dp_size)
    # untrimmed rows that do not fill whole steps on every rank are refused (SEMANTICS 6.1)
    assume(trim or len(rows) % dp_size == 0)
    with tempfile.TemporaryDirectory() as tmp:
        write_step(Path(tmp), rows)
        batch = plan(Path(tmp), **chosen)
    want = reference_metrics(rows, chosen, untrained=batch.meta.counts.untrained)
    got = batch.meta.stats
    assert set(got) == set(want)
    for name, value in want.items():
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
        "untrained_ratio": 0.0,
        # rank 0 gets rows 0 and 2 (5 + 4 tokens), rank 1 rows 1 and 3 (6 + 8 tokens)
        "rank_tokens/max_over_mean": 14 / 11.5,
    }


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
    manifest = Manifest.from_dict(build(rows_dir, tmp_path / "out", global_batch_size=4))
    lines = alarm_lines(manifest)
    assert len(lines) == len(alarms)
    for line, alarm in zip(lines, alarms, strict=True):
        assert line.startswith("step 1: warning: ") and alarm in line

"""The verl profile's settings and refusals (docs/verl.md): usage errors for settings verl
does not have or cannot take, and one line naming step, file, rule and rows for a step
whose rows verl's trainer could not take, with nothing written for that step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.errors import StepError, UsageError
from pipeline.settings import load_settings
from tests.support.cli import cli
from tests.support.samples import build, write_step
from tests.support.verl import SMALL_STEP, case_rows

SETTINGS = SMALL_STEP
# the same settings as a user types them
FLAGS = [f"--{name.replace('_', '-')}={value}" for name, value in SETTINGS.items()]


def rows(**changes: Any) -> list[dict[str, Any]]:
    return case_rows(groups=3, n=4, seed=5, **changes)


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"pad_token_id": None}, "pad_token_id: required by the verl trainer"),
        ({"adv_estimator": "gae"}, "adv_estimator: 'gae' is not built for verl"),
        ({"dp_size": 5}, "= 12 rows do not split into dp_size=5 equal parts"),
        ({"global_batch_size": 8}, "global_batch_size: not a setting of the verl trainer"),
        ({"balance_data": True}, "balance_data: not a setting of the verl trainer"),
        ({"balance_batch": "maybe"}, "balance_batch: Input should be a valid boolean"),
    ],
)
def test_settings_verl_cannot_take_are_usage_errors(changes: dict[str, Any], needle: str) -> None:
    values = {**SETTINGS, **changes}
    with pytest.raises(UsageError, match=needle):
        load_settings(**{k: v for k, v in values.items() if v is not None})


def test_miles_refuses_verls_settings_and_records_none_of_them() -> None:
    with pytest.raises(UsageError, match="rollout_n: not a setting of the miles trainer"):
        load_settings(global_batch_size=4, rollout_n=4)
    recorded = load_settings(global_batch_size=4).to_dict()
    assert "rollout_n" not in recorded and "balance_batch" not in recorded
    verl = load_settings(**SETTINGS).to_dict()
    assert verl["trainer"] == "verl" and "global_batch_size" not in verl


def _refusal(tmp_path: Path, step_rows: list[dict[str, Any]], **changes: Any) -> str:
    write_step(tmp_path / "in", step_rows)
    with pytest.raises(StepError) as caught:
        build(tmp_path / "in", tmp_path / "out", **{**SETTINGS, **changes})
    assert not (tmp_path / "out" / "step=1").exists()
    (violation,) = caught.value.violations
    return violation.line()


def test_a_prompt_longer_than_max_prompt_length_is_refused(tmp_path: Path) -> None:
    step = rows()
    step[5]["tokens"] = list(range(1, 10)) + step[5]["tokens"][-step[5]["response_length"] :]
    line = _refusal(tmp_path, step)
    assert line.startswith("step 1: ") and "step=1.parquet: rule max_prompt_length:" in line
    assert line.endswith("rows (index, leaf): (5, 0)")


def test_a_response_longer_than_max_response_length_is_refused(tmp_path: Path) -> None:
    line = _refusal(tmp_path, rows(), max_response_length=6)
    assert "rule max_response_length: " in line and "max_response_length=6" in line


def test_a_group_of_another_size_is_refused(tmp_path: Path) -> None:
    step = rows()
    step[3]["group_index"] = step[4]["group_index"]  # group 0 has 3 rows, group 1 has 5
    line = _refusal(tmp_path, step)
    assert "rule group_of_rollout_n: each prompt group must be exactly rollout_n=4" in line
    assert "rows (index, leaf): (0, 0), (1, 0), (2, 0), (3, 0), (4, 0)" in line


def test_a_split_group_is_refused(tmp_path: Path) -> None:
    step = rows()
    step[4:8], step[8:12] = step[8:12], step[4:8]
    for row in step[8:12]:
        row["group_index"] = step[0]["group_index"]  # group 0 again, four rows later
    line = _refusal(tmp_path, step)
    assert "rule group_of_rollout_n" in line and "(0, 0), (1, 0), (2, 0), (3, 0), (4, 0)" in line


def test_rows_without_group_index_are_refused(tmp_path: Path) -> None:
    step = rows()
    step[2]["group_index"] = None
    line = _refusal(tmp_path, step)
    assert "rule group_of_rollout_n: 1 rows have no group_index" in line


def test_a_step_without_train_batch_size_groups_is_refused(tmp_path: Path) -> None:
    line = _refusal(tmp_path, rows(), train_batch_size=2, dp_size=1)
    assert line.startswith("step 1: rule train_batch_size_groups: 12 rows make 3 prompt groups")


def test_the_cli_writes_the_valid_step_and_refuses_the_other(tmp_path: Path) -> None:
    write_step(tmp_path / "in", rows(), step=1)
    write_step(tmp_path / "in", rows()[:8], step=2)
    result = cli("build", tmp_path / "in", "--out", tmp_path / "out", *FLAGS)
    assert result.returncode == 1, result.stderr
    errors = [line for line in result.stderr.splitlines() if "rule " in line]
    assert errors == [
        "rollout-shards: build: step 2: rule train_batch_size_groups: 8 rows make 2 prompt "
        "groups of rollout_n=4, but train_batch_size=3 (verl's data.train_batch_size) asks "
        "for that many groups per step: build with the step's own count, or give the step "
        "that many groups"
    ]
    manifest = json.loads((tmp_path / "out" / "step=1" / "manifest.json").read_text())
    assert manifest["settings"]["trainer"] == "verl"
    assert manifest["counts"]["written"] == 12 and manifest["global_batch_size"] == 12
    assert not (tmp_path / "out" / "step=2").exists()
    usage = cli("build", tmp_path / "in", "--out", tmp_path / "o2", *FLAGS, "--adv-estimator=gae")
    assert usage.returncode == 2 and len(usage.stderr.splitlines()) == 1


def test_validate_checks_verls_batch(tmp_path: Path) -> None:
    write_step(tmp_path / "in", rows(), step=1)
    assert cli("validate", tmp_path / "in", *FLAGS).returncode == 0
    result = cli("validate", tmp_path / "in", *FLAGS, "--train-batch-size=4")
    assert result.returncode == 1
    assert "rule train_batch_size_groups: 12 rows make 3 prompt groups" in result.stderr


def test_a_verl_step_is_the_same_built_in_memory_or_rank_bounded(tmp_path: Path) -> None:
    write_step(tmp_path / "in", rows(), step=1)
    build(tmp_path / "in", tmp_path / "a", **SETTINGS)
    build(tmp_path / "in", tmp_path / "b", **SETTINGS, stream_above=0)
    for name in ("rank=0.parquet", "rank=1.parquet", "manifest.json"):
        a = (tmp_path / "a" / "step=1" / name).read_bytes()
        assert a == (tmp_path / "b" / "step=1" / name).read_bytes(), name


def test_a_struct_reward_is_read_through_reward_key_for_verl(tmp_path: Path) -> None:
    """`reward_key` is how every trainer reads a struct reward (a common setting): the same
    scores as a struct build the same rank files as plain floats."""
    plain = rows()
    struct = [{**row, "reward": {"score": row["reward"], "other": 0.5}} for row in plain]
    write_step(tmp_path / "plain", plain, step=1)
    write_step(tmp_path / "struct", struct, step=1)
    build(tmp_path / "plain", tmp_path / "a", **SETTINGS)
    build(tmp_path / "struct", tmp_path / "b", **SETTINGS, reward_key="score")
    for rank in range(2):
        name = f"step=1/rank={rank}.parquet"
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()

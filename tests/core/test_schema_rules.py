"""One test per schema rule: the rule fires, names its rows, and says what is wrong."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest

from pipeline.errors import StepError
from tests.support.rule_cases import CASES, V2
from tests.support.samples import plan, sample, write_step


def violations(root: Path, rows: list[dict[str, Any]], **settings: Any) -> list:
    write_step(root, rows)
    with pytest.raises(StepError) as excinfo:
        plan(root, **{"global_batch_size": 1, **settings})
    return excinfo.value.violations


def only(root: Path, rows: list[dict[str, Any]], **settings: Any):
    found = violations(root, rows, **settings)
    assert len(found) == 1, [v.line() for v in found]
    return found[0]


@pytest.mark.parametrize(
    ("rule", "rows", "message", "where"),
    CASES,
    ids=[f"{i}-{case[0]}" for i, case in enumerate(CASES)],
)
def test_rule(rows_dir: Path, rule: str, rows: list, message: str, where: list) -> None:
    violation = only(rows_dir, rows)
    assert violation.rule == rule
    assert message in violation.message
    assert violation.rows == where
    assert violation.step == 1
    assert violation.files == [str(rows_dir / "step=1.parquet")]
    line = violation.line()
    assert line.startswith(f"step 1: {rows_dir / 'step=1.parquet'}: rule {rule}: ")
    assert "rows (index, leaf): " + ", ".join(f"({i}, {leaf})" for i, leaf in where) in line


def test_siblings_must_share_one_rollout_id(rows_dir: Path) -> None:
    rows = [sample(5, 0, rollout_id=5, **V2), sample(5, 1, rollout_id=6, **V2)]
    violation = only(rows_dir, rows, advantage_estimator="ppo")
    assert violation.rule == "rollout_id_shared_by_siblings"
    assert violation.rows == [(5, 0), (5, 1)]


def test_rollout_id_must_not_equal_another_trajectorys_index(rows_dir: Path) -> None:
    rows = [sample(0, 0, rollout_id=1, **V2), sample(0, 1, rollout_id=1, **V2), sample(1, **V2)]
    violation = only(rows_dir, rows)
    assert violation.rule == "rollout_key_unique_per_trajectory"
    assert violation.rows == [(0, 0), (0, 1), (1, 0)]


def test_two_trajectories_must_not_share_a_rollout_id(rows_dir: Path) -> None:
    rows = [sample(i, leaf, rollout_id=9, **V2) for i in (0, 1) for leaf in (0, 1)]
    violation = only(rows_dir, rows)
    assert violation.rule == "rollout_key_unique_per_trajectory"
    assert violation.n_rows == 4


def test_siblings_share_one_reward(rows_dir: Path) -> None:
    rows = [
        sample(0, 0, rollout_id=0, reward=1.0, **V2),
        sample(0, 1, rollout_id=0, reward=0.0, **V2),
    ]
    violation = only(rows_dir, rows)
    assert violation.rule == "rollout_shares_reward"
    assert violation.message.startswith("all samples in rollout 0 must share one reward")


def test_nan_siblings_never_share_a_reward(rows_dir: Path) -> None:
    nan = float("nan")
    rows = [
        sample(0, 0, rollout_id=0, reward=nan, **V2),
        sample(0, 1, rollout_id=0, reward=nan, **V2),
    ]
    rules = {v.rule for v in violations(rows_dir, rows)}
    assert rules == {"rollout_shares_reward", "reward_finite"}


def test_step_column_must_agree_with_path(rows_dir: Path) -> None:
    violation = only(rows_dir, [sample(0, step=2), sample(1, step=1)])
    assert violation.rule == "step_matches_path"
    assert violation.rows == [(0, 0)]


def test_every_broken_rule_is_reported_once(rows_dir: Path) -> None:
    rows = [
        sample(0, status="done"),
        sample(1, session_version="v1", rollout_id=4),
        sample(2, response_length=2, loss_mask=[1]),
    ]
    rules = [v.rule for v in violations(rows_dir, rows)]
    assert sorted(rules) == ["loss_mask_length", "rollout_id_only_on_v2_multi_leaf", "status_isin"]


def test_at_most_five_rows_are_named(rows_dir: Path) -> None:
    violation = only(rows_dir, [sample(i, status="nope") for i in range(8)])
    assert violation.n_rows == 8
    assert len(violation.rows) == 5
    assert violation.line().endswith("(4, 0) and 3 more")


def test_missing_required_column(rows_dir: Path) -> None:
    rows_dir.mkdir(parents=True)
    pl.DataFrame({"index": [0], "status": ["completed"], "reward": [1.0]}).write_parquet(
        rows_dir / "step=1.parquet"
    )
    with pytest.raises(StepError) as excinfo:
        plan(rows_dir, global_batch_size=1)
    (violation,) = excinfo.value.violations
    assert violation.rule == "missing_column"
    assert "tokens, response_length" in violation.message


def test_wrong_type_names_column_and_rows(rows_dir: Path) -> None:
    rows_dir.mkdir(parents=True)
    line = '{"index": %d, "status": "completed", "tokens": [1, 2], "response_length": %s, '
    line += '"reward": 1}'
    (rows_dir / "step=1.jsonl").write_text(line % (0, "1") + "\n" + line % (1, '"x"') + "\n")
    with pytest.raises(StepError) as excinfo:
        plan(rows_dir, global_batch_size=1)
    (violation,) = excinfo.value.violations
    assert violation.rule == "column_type"
    assert violation.message.startswith("column response_length must be Int32")
    assert violation.rows == [(1, None)]


def test_repeated_leaf_of_a_trajectory_is_the_window_it_replaces() -> None:
    """multi_leaf_only_in_v2 asks whether some leaf of the row's trajectory repeats. It is
    computed by counting distinct leaves, not by a window inside a window; both agree on
    repeated, unique and null leaves, in several steps."""
    from pipeline import columns as c
    from pipeline.schemas import rules

    frame = pl.DataFrame(
        {
            c.STEP: [1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2],
            c.INDEX: [0, 0, 1, 1, 2, 0, 0, 3, 3, 4, 4],
            c.LEAF: [0, 1, 0, 0, None, 0, 0, None, None, None, 1],
        },
        schema={c.STEP: pl.Int64, c.INDEX: pl.Int64, c.LEAF: pl.Int32},
    )
    window = rules._REPEATED_LEAF.any().over(c.TRAJECTORY)
    got = frame.select(rules._HAS_REPEATED_LEAF.alias("new"), window.alias("old"))
    assert got.get_column("new").to_list() == got.get_column("old").to_list()
    assert got.get_column("new").to_list() == [
        False, False, True, True, False, True, True, True, True, False, False
    ]  # fmt: skip

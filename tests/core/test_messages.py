"""The lines a user reads when a step is refused: the offending value and the file's row,
the suggestion where one exists, the project's own words for a missing setting, and the
trainer's own words for its rollout-id rule."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.schemas.validate import QUARANTINE_HINT
from tests.support.samples import sample, write_step


def _stderr(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, list[str]]:
    status = main([*map(str, args)])
    return status, capsys.readouterr().err.splitlines()


# The line of eleven rows validated with a global batch size of 16, up to its suggestion.
NOT_ENOUGH = (
    "rollout-shards: validate: step 1: rule not_enough_samples: not enough samples 11 for "
    "global_batch_size 16; "
)


def _eleven_rows(
    capsys: pytest.CaptureFixture[str], folder: Path, per_prompt: int, dp_size: int, batch: int
) -> tuple[int, list[str]]:
    """`validate` of eleven rows in prompts of `per_prompt` samples, with those sizes."""
    write_step(folder, [sample(i, group_index=i // per_prompt) for i in range(11)])
    flags = ("--global-batch-size", str(batch), "--dp-size", str(dp_size))
    return _stderr(capsys, "validate", folder, *flags)


def test_a_nan_reward_names_its_value_file_row_and_quarantine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # prompts of two samples: quarantine sets row 2's whole group aside (reward groups are
    # kept whole), and the trim to whole batches then cuts a whole group too
    rows = [sample(i, reward=float(i % 2), group_index=i // 2) for i in range(8)]
    rows[2]["reward"] = math.nan
    path = write_step(tmp_path / "in", rows)
    status, lines = _stderr(
        capsys, "build", tmp_path / "in", "--out", tmp_path / "out", "--global-batch-size", "4"
    )
    assert status == 1
    assert lines == [
        f"rollout-shards: build: step 1: {path}: rule reward_finite: reward must be a finite "
        f"number on every row; file row 3 has reward NaN; {QUARANTINE_HINT}; "
        "rows (index, leaf): (2, 0)"
    ]
    # the suggestion holds: quarantining builds the rest
    status, _ = _stderr(
        capsys, "build", tmp_path / "in", "--out", tmp_path / "out", "--global-batch-size", "4",
        "--on-invalid", "quarantine",
    )  # fmt: skip
    assert status == 0


def test_a_row_of_a_second_file_names_that_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "in" / "step=1"
    folder.mkdir(parents=True)
    rows = [sample(i) for i in range(8)]
    rows[6]["response_length"] = 40
    write_step(tmp_path / "a", rows[:4]).rename(folder / "part-0.parquet")
    write_step(tmp_path / "b", rows[4:]).rename(folder / "part-1.parquet")
    status, lines = _stderr(capsys, "validate", tmp_path / "in", "--global-batch-size", "4")
    assert status == 1
    (line,) = lines
    assert "rule response_within_tokens: " in line
    assert "; file row 3 has response_length 40, tokens " in line  # row 3 of part-1


SUGGESTED = "--global-batch-size {} is the largest this step fills (a multiple of dp_size {} "


@pytest.mark.parametrize(
    ("per_prompt", "dp_size", "told"),
    [
        # prompts of four samples: the suggested batch of 8 trims the last prompt whole
        (4, 4, SUGGESTED.format(8, 4) + "whose trim cuts no reward group)"),
        # prompts of three samples: 10 (the largest multiple of dp_size 2) would trim row
        # 10 out of the last prompt, and 8 (kept 8) would cut the third; 6 keeps two
        # prompts whole
        (3, 2, SUGGESTED.format(6, 2) + "whose trim cuts no reward group)"),
        # prompts of three samples, dp_size 4: batches of 4 or 8 both keep 8 rows, inside
        # a prompt
        (
            3,
            4,
            "no multiple of dp_size 4 up to 11 rows ends on a reward group's edge: give "
            "every row its group_index, or set disable_rollout_trim_samples",
        ),
    ],
    ids=["suggested", "one whose trim cuts no group", "none"],
)
def test_too_few_samples_suggest_the_largest_batch_the_step_fills(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], per_prompt: int, dp_size: int, told: str
) -> None:
    assert _eleven_rows(capsys, tmp_path / "in", per_prompt, dp_size, 16) == (
        1,
        [NOT_ENOUGH + told],
    )


def test_the_suggested_batch_size_is_one_whose_trim_cuts_no_reward_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _eleven_rows(capsys, tmp_path / "in", 4, 4, 8)[0] == 0  # as suggested above
    # prompts of three samples: 10, 8 and 4 each trim into a prompt (the suggestion: 6)
    write_step(tmp_path / "in", [sample(i, group_index=i // 3) for i in range(11)])
    args = ("validate", tmp_path / "in", "--dp-size", "2", "--global-batch-size")
    status, lines = _stderr(capsys, *args, "10")
    assert status == 1
    (line,) = lines
    assert "rule trim_cuts_reward_group: " in line
    assert "(--global-batch-size 6 is the largest), or set disable_rollout_trim_samples" in line
    for size in ("8", "4"):  # each trims into a prompt
        assert _stderr(capsys, *args, size)[0] == 1
    assert _stderr(capsys, *args, "6")[0] == 0  # the suggestion holds


def test_quarantine_is_not_suggested_when_the_batch_is_one_reward_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # no group_index and no rollout_batch_size x n_samples_per_prompt: miles normalizes the
    # whole batch as one group, so setting a row aside would renormalize every other row
    rows = [sample(i, reward=float(i % 2)) for i in range(8)]
    rows[2]["reward"] = math.nan
    path = write_step(tmp_path / "in", rows)
    args = ("build", tmp_path / "in", "--out", tmp_path / "out", "--global-batch-size", "4")
    status, lines = _stderr(capsys, *args)
    assert status == 1
    assert lines == [
        f"rollout-shards: build: step 1: {path}: rule reward_finite: reward must be a finite "
        "number on every row; file row 3 has reward NaN; --on-invalid quarantine cannot set "
        "them aside: without group_index, a batch of 8 rows that is not rollout_batch_size x "
        "n_samples_per_prompt rows is one reward group, which any row taken out would "
        "renormalize; give every row its group_index; rows (index, leaf): (2, 0)"
    ]
    assert QUARANTINE_HINT not in lines[0]
    # and quarantine would indeed be refused
    status, lines = _stderr(capsys, *args, "--on-invalid", "quarantine")
    assert status == 1
    assert "rule quarantine_changes_reward_group: " in lines[0]


def test_a_missing_batch_size_in_the_projects_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_step(tmp_path / "in", [sample(i) for i in range(4)])
    status, lines = _stderr(capsys, "build", tmp_path / "in", "--out", tmp_path / "out")
    assert status == 2
    (line,) = lines
    assert "Field required" not in line
    assert line == (
        "rollout-shards: usage error: invalid settings: global_batch_size: required by the "
        "miles trainer (miles' --global-batch-size): give --global-batch-size, or "
        "global_batch_size in --config or in the input root's rollout-shards.yaml"
    )


def test_slime_names_its_rollout_id_rule_in_its_own_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [sample(0, 0, rollout_id=5), sample(0, 1), *(sample(i) for i in range(1, 4))]
    write_step(tmp_path / "in", rows)
    status, lines = _stderr(
        capsys, "validate", tmp_path / "in", "--trainer", "slime", "--global-batch-size", "2",
        "--rollout-batch-size", "2",
    )  # fmt: skip
    assert status == 1
    (line,) = lines
    assert "rule rollout_id_on_multi_leaf: a compact rollout" in line
    assert "Sample.rollout_id set on every sibling so the loss reducer" in line
    assert "miles" not in line and "2536" not in line


def test_no_build_names_a_pull_request_for_the_rollout_id_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [sample(i, session_version="v1") for i in range(4)]
    rows[2]["rollout_id"] = 2
    write_step(tmp_path / "in", rows)
    status, lines = _stderr(capsys, "validate", tmp_path / "in", "--global-batch-size", "2")
    assert status == 1
    (line,) = lines
    assert "rule rollout_id_only_on_v2_multi_leaf: rollout_id must be set exactly" in line
    assert "file row 3 has rollout_id 2, session_version v1, leaves 1" in line
    assert "PR #" not in line

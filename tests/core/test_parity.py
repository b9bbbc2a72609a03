"""`rollout-shards parity`: two builds or two inputs, compared field by field and bitwise."""

from __future__ import annotations

import json
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from pipeline import columns as c
from pipeline.cli import main
from pipeline.parity.compare import compare_frames
from tests.support.samples import REPO, build, sample, write_step

SETTINGS = {"global_batch_size": 4, "dp_size": 2, "rewards_normalization": False}


def rows() -> list[dict[str, Any]]:
    """Eight v1 single-leaf samples in four prompt groups, with log probs and a round."""
    return [
        sample(
            i,
            group_index=i // 2,
            session_version="v1",
            reward=0.0 if i % 2 else 1.0,
            rollout_log_probs=[-0.5, 0.25 * i],
            round_number=3,
        )
        for i in range(8)
    ]


@pytest.fixture
def builds(tmp_path: Path) -> tuple[Path, Path]:
    """Two output roots built from the same table with the same settings."""
    write_step(tmp_path / "rollouts", rows())
    for name in ("a", "b"):
        build(tmp_path / "rollouts", tmp_path / name, **SETTINGS)
    return tmp_path / "a", tmp_path / "b"


def run(*args: str | Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    status = main(["parity", *map(str, args)])
    return status, capsys.readouterr().out.splitlines()


def find_row(out: Path, where: pl.Expr) -> tuple[Path, int]:
    """The first shard of step 1 holding a row that matches, and that row's batch position."""
    for shard in sorted((out / "step=1").glob("rank=*.parquet")):
        found = pl.read_parquet(shard).filter(where)
        if found.height:
            return shard, found[c.BATCH_POSITION][0]
    raise AssertionError("no such row")


def rewrite(shard: Path, change: pl.Expr | None = None, keep: pl.Expr | None = None) -> None:
    frame = pl.read_parquet(shard)
    if change is not None:
        frame = frame.with_columns(change)
    if keep is not None:
        frame = frame.filter(keep)
    frame.write_parquet(shard)


def set_at(shard: Path, position: int, column: str, value: Any) -> None:
    """`column` of the row at batch position `position` of `shard` set to `value`."""
    rewrite(
        shard,
        pl.when(pl.col(c.BATCH_POSITION) == position)
        .then(value)
        .otherwise(pl.col(column))
        .alias(column),
    )


def test_identical_builds(builds: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    status, lines = run(*builds, capsys=capsys)
    assert status == 0
    assert lines[-1] == "identical"


@pytest.mark.parametrize(
    ("found", "column", "value", "line"),
    [
        # a float64 column compares by bits: 0.0 against -0.0
        (
            pl.col(c.REWARDS) == 0.0,
            c.REWARDS,
            -0.0,
            "  step 1, batch_position {position}: left 0.0 (0x0000000000000000), "
            "right -0.0 (0x8000000000000000)",
        ),
        # list<float32> compares element by element, by bits: 0.0 against -0.0
        (
            pl.col(c.SAMPLE_INDICES) == 0,
            c.ROLLOUT_LOG_PROBS,
            pl.lit([-0.5, -0.0], dtype=pl.List(pl.Float32)),
            "  step 1, batch_position {position}, element 1 (lengths 2 and 2): "
            "left 0.0 (0x00000000), right -0.0 (0x80000000)",
        ),
    ],
    ids=["negative_zero_reward", "log_prob_element"],
)
def test_a_value_that_differs_only_in_bits_is_pinpointed(
    builds: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
    found: pl.Expr,
    column: str,
    value: Any,
    line: str,
) -> None:
    left, right = builds
    shard, position = find_row(right, found)
    set_at(shard, position, column, value)
    status, lines = run(left, right, capsys=capsys)
    assert status == 1
    assert f"column {column}: 1 of 8 rows differ" in lines
    assert line.format(position=position) in lines
    assert lines[-1] == "1 columns differ"


def test_changed_rollout_id(builds: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    left, right = builds
    shard = right / "step=1" / "rank=1.parquet"
    position = pl.read_parquet(shard)[c.BATCH_POSITION][0]
    set_at(shard, position, c.ROLLOUT_IDS, None)
    status, lines = run(left, right, "--format", "json", capsys=capsys)
    assert status == 1
    report = json.loads("\n".join(lines))
    assert report["summary"] == "1 columns differ"
    (column,) = report["columns"]
    assert column["column"] == c.ROLLOUT_IDS and column["rows"] == 1
    (example,) = column["examples"]
    left_id = pl.read_parquet(left / "step=1" / "rank=1.parquet")[c.ROLLOUT_IDS][0]
    assert example == {
        "key": {"step": 1, "batch_position": position},
        "left": left_id,
        "right": None,
    }


def test_missing_row(builds: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    left, right = builds
    shard = right / "step=1" / "rank=1.parquet"
    last = pl.read_parquet(shard)[c.BATCH_POSITION][-1]
    rewrite(shard, keep=pl.col(c.BATCH_POSITION) != last)
    status, lines = run(left, right, capsys=capsys)
    assert status == 1
    assert "rows: 1 only in left, 0 only in right" in lines
    assert f"  only in left: step 1, batch_position {last}" in lines
    assert lines[-1] == "0 columns differ, 1 rows on one side only"


def test_unlisted_one_sided_rows_are_counted(
    builds: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    left, right = builds
    for shard in (right / "step=1").glob("rank=*.parquet"):
        rewrite(shard, keep=pl.lit(False))
    status, lines = run(left, right, capsys=capsys)
    assert status == 1
    assert "rows: 8 only in left, 0 only in right" in lines
    listed = [line for line in lines if line.startswith("  only in left: ")]
    assert len(listed) == 5
    assert lines[lines.index(listed[-1]) + 1] == "  and 3 more"


def test_column_on_one_side(builds: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    left, right = builds
    for shard in (right / "step=1").glob("rank=*.parquet"):
        pl.read_parquet(shard).drop(c.ROUND_NUMBER).write_parquet(shard)
    status, lines = run(left, right, capsys=capsys)
    assert status == 1
    assert "column round_number: only in left (8 rows)" in lines
    assert "  step 1, batch_position 0: left 3, right (absent)" in lines
    assert "  and 3 more" in lines  # 5 of the 8 rows listed
    assert lines[-1] == "1 columns differ"


def test_rank_layout_is_compared(
    builds: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """The same rows in another rank order are another payload for the trainer."""
    left, right = builds
    shard = right / "step=1" / "rank=0.parquet"
    pl.read_parquet(shard).reverse().write_parquet(shard)
    status, lines = run(left, right, capsys=capsys)
    assert status == 1
    assert "column rank_position: 4 of 8 rows differ" in lines


def test_step_folders(builds: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    left, right = builds
    status, lines = run(left / "step=1", right / "step=1", capsys=capsys)
    assert (status, lines[-1]) == (0, "identical")


@pytest.mark.parametrize(
    ("left_id", "header"),
    [
        ({"rollout_id": None}, "column rollout_id: 1 of 2 rows differ"),
        ({}, "column rollout_id: absent in left (read as null), 1 of 2 rows differ"),
    ],
    ids=["null", "absent"],
)
def test_seed_case_rollout_id_none_against_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], left_id: dict[str, Any], header: str
) -> None:
    """miles PR #2536: a v1 payload and a v2 one part only at `sample.rollout_id`."""
    v1 = [sample(0, session_version="v1", **left_id), sample(1, session_version="v1")]
    v2 = [sample(0, session_version="v1", rollout_id=0), sample(1, session_version="v1")]
    write_step(tmp_path / "v1", v1)
    write_step(tmp_path / "v2", v2, fmt="jsonl")
    status, lines = run(tmp_path / "v1", tmp_path / "v2", capsys=capsys)
    assert status == 1
    assert lines[0].startswith("parity of inputs") and "(step, index, leaf)" in lines[0]
    assert lines[1:] == [
        header,
        "  step 1, index 0, leaf 0: left null, right 0",
        "1 columns differ",
    ]


def test_identical_inputs_in_other_formats(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_step(tmp_path / "a", rows())
    write_step(tmp_path / "b", rows(), fmt="arrow")
    status, lines = run(tmp_path / "a", tmp_path / "b", capsys=capsys)
    assert (status, lines[-1]) == (0, "identical")


def test_miles_dumps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.support.miles_dump import sample_dict, write_dump

    samples = [sample_dict(index=i, reward=float(i)) for i in range(3)]
    write_dump(tmp_path / "a" / "rollout_data" / "2.pt", 2, samples)
    samples[1]["rollout_id"] = 0
    write_dump(tmp_path / "b" / "rollout_data" / "2.pt", 2, samples)
    status, lines = run(tmp_path / "a", tmp_path / "b", capsys=capsys)
    assert status == 1
    assert "  step 2, index 1, leaf 0: left null, right 0" in lines


def test_usage_errors(builds: tuple[Path, Path], tmp_path: Path) -> None:
    left, _ = builds
    write_step(tmp_path / "inputs", rows())
    assert main(["parity", str(left), str(tmp_path / "inputs")]) == 2
    assert main(["parity", str(left), str(tmp_path / "missing")]) == 2


def test_cli_subprocess(builds: tuple[Path, Path]) -> None:
    left, right = builds

    def cli(*args: Path | str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pipeline.cli", "parity", *map(str, args)],
            capture_output=True,
            text=True,
            cwd=REPO,
            check=False,
        )

    same = cli(left, right)
    assert (same.returncode, same.stdout.splitlines()[-1]) == (0, "identical")
    rewrite(
        right / "step=1" / "rank=1.parquet",
        (pl.col(c.REWARDS) + 1.0).alias(c.REWARDS),
    )
    differ = cli(left, right)
    assert differ.returncode == 1 and "column rewards" in differ.stdout
    missing = cli(left, right / "nope")
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_nan_equals_nan_only_with_the_same_bits() -> None:
    quiet = np.array([0x7FF8000000000000], dtype=np.uint64).view(np.float64)[0]
    payload = np.array([0x7FF8000000000001], dtype=np.uint64).view(np.float64)[0]
    keys = {"step": [1, 1, 1], "batch_position": [0, 1, 2]}
    left = pl.DataFrame({**keys, "x": [quiet, quiet, 0.0]})
    right = pl.DataFrame({**keys, "x": [quiet, payload, 0.0]})
    (diff,), _ = compare_frames(left, right, ("step", "batch_position"))
    assert diff.rows == 1
    (example,) = diff.examples
    assert example["key"] == {"step": 1, "batch_position": 1}
    assert (example["left_bits"], example["right_bits"]) == (
        "0x7ff8000000000000",
        "0x7ff8000000000001",
    )


def naive_differences(left: list[dict], right: list[dict]) -> dict[str, int]:
    """Per column, the matched rows whose values differ, one Python comparison at a time."""

    def bits(value: Any, fmt: str) -> Any:
        if value is None:
            return None
        if isinstance(value, list):
            return [bits(v, fmt) for v in value]
        return struct.pack(fmt, value)

    by_key = {row["k"]: row for row in right}
    counts = {"f": 0, "l": 0, "i": 0}
    for row in left:
        other = by_key.get(row["k"])
        if other is None:
            continue
        counts["f"] += bits(row["f"], "<d") != bits(other["f"], "<d")
        counts["l"] += bits(row["l"], "<f") != bits(other["l"], "<f")
        counts["i"] += row["i"] != other["i"]
    return {k: v for k, v in counts.items() if v}


def test_matches_a_naive_comparison() -> None:
    generator = random.Random(7)
    floats = [0.0, -0.0, float("nan"), 1.5, None]

    def table(n: int) -> list[dict[str, Any]]:
        rows = [
            {
                "k": k,
                "f": generator.choice(floats),
                "l": generator.choice([None, [], [generator.choice(floats[:4]) for _ in range(2)]]),
                "i": generator.choice([None, 0, 1]),
            }
            for k in range(n)
        ]
        return [r for r in rows if generator.random() > 0.1]

    schema = {"k": pl.Int64, "f": pl.Float64, "l": pl.List(pl.Float32), "i": pl.Int64}
    for _ in range(20):
        left, right = table(30), table(30)
        diffs, one_sided = compare_frames(
            pl.DataFrame(left, schema=schema), pl.DataFrame(right, schema=schema), ("k",)
        )
        assert {d.column: d.rows for d in diffs} == naive_differences(left, right)
        left_keys, right_keys = {r["k"] for r in left}, {r["k"] for r in right}
        assert one_sided["only_left"] == len(left_keys - right_keys)
        assert one_sided["only_right"] == len(right_keys - left_keys)


def test_inputs_whose_reward_type_differs_by_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The embedded rollouts: float rewards in three steps, a struct of scores in step 4.
    No type holds both as they are, so the column is compared as JSON text on both sides
    (a note says so), and a changed score is still found."""
    status, lines = run(REPO / "data" / "rollouts", REPO / "data" / "rollouts", capsys=capsys)
    assert status == 0
    assert lines[-1] == "identical"
    assert "note: compared as JSON text, their types differing between steps: reward (" in (
        "\n".join(lines)
    )
    changed = tmp_path / "rollouts"
    shutil.copytree(REPO / "data" / "rollouts", changed)
    step4 = pl.read_parquet(changed / "step=4.parquet")
    step4.with_columns(
        pl.when(pl.int_range(pl.len()) == 0)
        .then(pl.struct(pl.lit(0.25).alias("score"), pl.col("reward").struct.field("format")))
        .otherwise(pl.col("reward"))
        .alias("reward")
    ).write_parquet(changed / "step=4.parquet")
    status, lines = run(REPO / "data" / "rollouts", changed, capsys=capsys)
    assert status == 1
    assert lines[-1] == "1 columns differ"
    assert 'left "{\\"score\\":0.0,\\"format\\":1.0}", right "{\\"score\\":0.25,' in (
        "\n".join(lines)
    )

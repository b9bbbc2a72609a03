"""The rollout-side schedule and the balanced split, end to end through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from tests.support.cli import cli
from tests.support.samples import sample, write_step


def shards(out: Path, step: int = 1) -> tuple[list[pl.DataFrame], dict]:
    folder = out / f"step={step}"
    manifest = json.loads((folder / "manifest.json").read_text())
    ranks = [o for o in manifest["outputs"] if o["path"].startswith("rank=")]
    return [pl.read_parquet(folder / o["path"]) for o in ranks], manifest


def test_dynamic_schedule_shows_in_shards_and_manifest(tmp_path: Path) -> None:
    # SEMANTICS 7.6: lengths [5,1,4,2,3,3,2,4], cap 6, dp 2 -> ranks [[0,1,7,6],[2,3,4,5]].
    lengths = [5, 1, 4, 2, 3, 3, 2, 4]
    write_step(
        tmp_path / "in",
        [sample(i, tokens=[1] * n, response_length=1) for i, n in enumerate(lengths)],
    )
    out = tmp_path / "out"
    args = ["--global-batch-size", "8", "--dp-size", "2", "--cp-size", "1"]
    result = cli(
        "build",
        tmp_path / "in",
        "--out",
        out,
        *args,
        "--use-dynamic-batch-size",
        "--max-tokens-per-gpu",
        "6",
    )
    assert result.returncode == 0, result.stderr
    ranks, manifest = shards(out)
    assert [r.get_column("batch_position").to_list() for r in ranks] == [[0, 1, 7, 6], [2, 3, 4, 5]]
    assert [r.get_column("micro_batch").to_list() for r in ranks] == [[0, 0, 1, 1], [0, 0, 1, 1]]
    assert [r.get_column("train_step").to_list() for r in ranks] == [[0] * 4, [0] * 4]
    assert manifest["num_train_steps"] == 1
    assert manifest["num_microbatches"] == [2]
    assert manifest["num_rollouts"] == [8]


def test_static_schedule_drops_trailing_rollouts(tmp_path: Path) -> None:
    # SEMANTICS 7.6: rollout ids [7,3,7,9,3], lengths 1..5, G 2, dp 1 -> [4,2,1,0], 9 dropped.
    rows = [
        sample(7, 0, session_version="v2", rollout_id=7, tokens=[1], response_length=1),
        sample(3, 0, session_version="v2", rollout_id=3, tokens=[1] * 2, response_length=1),
        sample(7, 1, session_version="v2", rollout_id=7, tokens=[1] * 3, response_length=1),
        sample(9, 0, session_version="v2", tokens=[1] * 4, response_length=1),
        sample(3, 1, session_version="v2", rollout_id=3, tokens=[1] * 5, response_length=1),
    ]
    write_step(tmp_path / "in", rows)
    out = tmp_path / "out"
    args = [
        "--global-batch-size",
        "2",
        "--cp-size",
        "1",
        "--use-dynamic-batch-size",
        "--max-tokens-per-gpu",
        "100",
    ]
    result = cli("build", tmp_path / "in", "--out", out, *args)
    assert result.returncode == 0, result.stderr
    (rank,), manifest = shards(out)
    assert rank.get_column("batch_position").to_list() == [4, 2, 1, 0]
    assert manifest["counts"]["dropped"] == 1
    assert manifest["counts"]["written"] == 4
    assert "1 dropped" in result.stdout


@pytest.mark.parametrize(
    ("rows", "flags", "phrases"),
    [
        (
            6,
            "--global-batch-size 6 --dp-size 2 --cp-size 1 --micro-batch-size 2",
            ["rule schedule_", "micro_batch_size"],
        ),
        (
            3,
            "--global-batch-size 2 --dp-size 2 --balance-data --disable-rollout-trim-samples",
            ["rule balance_not_divisible"],
        ),
    ],
    ids=["schedule_that_cannot_align", "balanced_split_needs_rows_divisible_by_ranks"],
)
def test_a_layout_that_cannot_split_is_reported_by_validate(
    rows: int, flags: str, phrases: list[str], tmp_path: Path
) -> None:
    write_step(tmp_path / "in", [sample(i) for i in range(rows)])
    result = cli("validate", tmp_path / "in", *flags.split())
    assert result.returncode == 1
    for phrase in phrases:
        assert phrase in result.stderr


def test_balanced_plain_split(tmp_path: Path) -> None:
    # SEMANTICS 7.3 check: [1,2,3,4], k=2, equal -> [[0,3],[1,2]].
    write_step(
        tmp_path / "in",
        [sample(i, tokens=[1] * n, response_length=1) for i, n in enumerate([1, 2, 3, 4])],
    )
    out = tmp_path / "out"
    result = cli(
        "build",
        tmp_path / "in",
        "--out",
        out,
        "--global-batch-size",
        "4",
        "--dp-size",
        "2",
        "--balance-data",
    )
    assert result.returncode == 0, result.stderr
    ranks, _ = shards(out)
    assert [r.get_column("batch_position").to_list() for r in ranks] == [[0, 3], [1, 2]]


def test_schedule_through_a_dagster_materialization(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dagster as dg

    from tests.support.dagster_roots import configured_roots, materialize

    roots = configured_roots(tmp_path, monkeypatch)
    settings = {"cp_size": 1, "use_dynamic_batch_size": True, "max_tokens_per_gpu": 40}
    run_config = {"ops": {"rollout_samples": {"config": settings}}}
    with dg.instance_for_test() as instance:
        result = materialize(instance, "00000003", run_config)
        assert result.success
        assert all(check.passed for check in result.get_asset_check_evaluations())
    ranks, manifest = shards(roots.output, step=3)
    assert manifest["settings"]["cp_size"] == 1
    assert manifest["num_microbatches"] is not None and manifest["num_microbatches"][0] >= 1
    for rank in ranks:
        assert rank.get_column("micro_batch").null_count() == 0
        # each micro-batch within the cap (40 tokens) unless it is a single row
        sizes = rank.group_by("train_step", "micro_batch").agg(
            pl.col("total_lengths").sum().alias("tokens"), pl.len().alias("rows")
        )
        assert sizes.filter((pl.col("tokens") > 40) & (pl.col("rows") > 1)).height == 0
    # siblings of one rollout share a train step, across ranks
    rows = pl.concat(ranks)
    assert (
        rows.group_by("rollout_ids").agg(pl.col("train_step").n_unique()).get_column("train_step")
        == 1
    ).all()

"""read_rank equals the reference's rank dict (miles' trainer view), key by key, floats
by bits: worked cases, hypothesis tables, the embedded data, and scheduled, dynamic,
balanced and compact steps."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from rollout_shards_loader import read_manifest, read_rank

from pipeline.errors import StepError
from tests.support.loader import (
    WORKED,
    assert_same_dict,
    expected_rank_dicts,
    numpy_as_python,
    read_rows,
    rewrite_manifest,
    rows_with_extras,
)
from tests.support.samples import REPO, build, dropped_rollout_rows, sample, write_step
from tests.support.strategies import build_settings, trajectories


def _check(rows: list[dict[str, Any]], out: Path, **chosen: Any) -> list[dict[str, Any]]:
    build(out.parent / "in", out, **chosen)
    folder = out / "step=1"
    want = expected_rank_dicts(rows, chosen, folder)
    got = [read_rank(folder, rank) for rank in range(len(want))]
    for got_rank, want_rank in zip(got, want, strict=True):
        assert_same_dict(got_rank, want_rank)
    for rank, want_rank in enumerate(want):  # the numpy form holds the same values
        assert_same_dict(numpy_as_python(read_rank(folder, rank, as_numpy=True)), want_rank)
    return got


@pytest.mark.parametrize("case", sorted(WORKED))
def test_worked_cases(case: str, tmp_path: Path) -> None:
    rows, chosen = WORKED[case]
    write_step(tmp_path / "in", rows)
    _check(rows, tmp_path / "out", **chosen)


def test_weight_versions_as_empty_lists_on_a_rank_without_them(tmp_path: Path) -> None:
    rows = [sample(i, weight_versions=["w7"] if i == 0 else None) for i in range(4)]
    write_step(tmp_path / "in", rows)
    got = _check(rows, tmp_path / "out", global_batch_size=2, dp_size=2)
    assert got[0]["weight_versions"] == [["w7"], []]
    assert got[1]["weight_versions"] == [[], []]


def test_dict_holds_miles_keys_only(tmp_path: Path) -> None:
    rows = rows_with_extras(8)
    write_step(tmp_path / "in", rows)
    got = _check(rows, tmp_path / "out", global_batch_size=4, dp_size=2)[1]
    for absent in ("metadata", "partition", "batch_position", "train_step", "micro_batch"):
        assert absent not in got
    assert "num_microbatches" not in got
    assert got["sample_indices"] == [1, 3, 5, 7]
    assert got["total_lengths"] == [2 + 1 + i % 3 for i in (1, 3, 5, 7)]
    assert len(got["raw_reward"]) == 8
    assert all(type(v) is float for v in got["raw_reward"])
    assert all(type(x) is int for row in got["tokens"] for x in row)


def test_balanced_step(tmp_path: Path) -> None:
    rows = [
        sample(i, response_length=n, reward=float(n))
        for i, n in enumerate([9, 1, 8, 2, 7, 3, 6, 4])
    ]
    write_step(tmp_path / "in", rows)
    got = _check(rows, tmp_path / "out", global_batch_size=4, dp_size=2, balance_data=True)
    assert sorted(got[0]["sample_indices"] + got[1]["sample_indices"]) == list(range(8))


@pytest.mark.parametrize(
    "chosen",
    [
        {
            "global_batch_size": 2,
            "dp_size": 2,
            "cp_size": 1,
            "use_dynamic_batch_size": True,
            "max_tokens_per_gpu": 8,
        },
        {
            "global_batch_size": 2,
            "dp_size": 2,
            "cp_size": 1,
            "micro_batch_size": 1,
            "balance_data": True,
        },
    ],
    ids=["dynamic_micro_batches", "static_balanced"],
)
def test_scheduled_step_with_dropped_rows(chosen: dict[str, Any], tmp_path: Path) -> None:
    rows = dropped_rollout_rows()
    write_step(tmp_path / "in", rows)
    got = _check(rows, tmp_path / "out", **chosen)
    manifest = read_manifest(tmp_path / "out" / "step=1")
    assert manifest["dropped_positions"] == [7, 8]
    assert manifest["counts"]["dropped"] == 2
    assert got[0]["raw_reward"] == [row["reward"] for row in rows]
    assert got[0]["num_rollouts"] == [2, 2]
    for rank in got:
        flat = [i for mb in rank["micro_batch_indices"] for i in mb]
        assert flat == list(range(len(rank["tokens"])))


def test_embedded_data(tmp_path: Path) -> None:
    data = tmp_path / "in"
    shutil.copytree(REPO / "data" / "rollouts", data)
    chosen = {"global_batch_size": 8, "dp_size": 2, "reward_key": "score"}
    for source in sorted(p for p in data.iterdir() if p.name.startswith("step=")):
        step = int(source.name.split("=")[1].split(".")[0])
        rows = read_rows(source)
        step_in = tmp_path / f"one-{step}" / "in"
        step_in.mkdir(parents=True)
        target = step_in / source.name.replace(f"step={step}", "step=1")
        (shutil.copytree if source.is_dir() else shutil.copy)(source, target)
        _check(rows, step_in.parent / "out", **chosen)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=trajectories(), chosen=build_settings())
def test_hypothesis_tables(rows: list[dict[str, Any]], chosen: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        write_step(Path(tmp) / "in", rows)
        try:
            _check(rows, Path(tmp) / "out", **chosen)
        except StepError:
            return  # refused steps are the differential test's business


def test_mismatched_settings_and_missing_manifest(tmp_path: Path) -> None:
    write_step(tmp_path / "in", [sample(i) for i in range(4)])
    build(tmp_path / "in", tmp_path / "out", global_batch_size=2, dp_size=2)
    folder = tmp_path / "out" / "step=1"
    with pytest.raises(ValueError, match="dp_size=4 .*dp_size=2"):
        read_rank(folder, 0, dp_size=4)
    with pytest.raises(ValueError, match="global_batch_size=8 .*global_batch_size=2"):
        read_rank(folder, 0, global_batch_size=8)
    assert read_rank(folder, 1, dp_size=2, global_batch_size=2)["sample_indices"] == [1, 3]
    (folder / "manifest.json").unlink()
    with pytest.raises(FileNotFoundError, match="no manifest"):
        read_rank(folder, 0)
    with pytest.raises(FileNotFoundError):
        read_manifest(folder)


def test_steps_with_one_column_set_and_present_columns(tmp_path: Path) -> None:
    """Rank files carrying `step` and `rank` and null optional columns the batch lacks,
    listed in the manifest's `present_columns`, read the same."""
    rows = rows_with_extras(8)
    write_step(tmp_path / "in", rows)
    build(tmp_path / "in", tmp_path / "out", global_batch_size=4, dp_size=2)
    folder = tmp_path / "out" / "step=1"
    before = [read_rank(folder, rank) for rank in range(2)]
    for rank in range(2):
        path = folder / f"rank={rank}.parquet"
        table = pq.read_table(path)
        n = table.num_rows
        table = table.append_column("step", pa.array([1] * n, pa.int64()))
        table = table.append_column("rank", pa.array([rank] * n, pa.int32()))
        table = table.append_column(
            "teacher_log_probs", pa.array([None] * n, pa.list_(pa.float32()))
        )
        pq.write_table(table, path)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["present_columns"] = [
        "rollout_log_probs",
        "weight_versions",
        "round_number",
        "metadata",
    ]
    for output in manifest["outputs"]:  # the files as that build wrote them
        output["sha256"] = hashlib.sha256((folder / output["path"]).read_bytes()).hexdigest()
    rewrite_manifest(folder, manifest, seal=False)
    for rank in range(2):
        assert_same_dict(read_rank(folder, rank), before[rank])

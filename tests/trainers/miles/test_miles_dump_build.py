"""A miles `--dump-details` folder builds into shards through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from tests.support.cli import cli
from tests.support.miles_dump import leaf_descriptor, sample_dict, write_dump


def v2_dump(root: Path) -> Path:
    """Step 5: a v2 call with three leaves (stamped id 40), two v2 singletons, an eval dump."""
    leaves = [
        sample_dict(
            index=40,
            group_index=0,
            rollout_id=40,
            reward=1.0,
            metadata={"leaf": leaf_descriptor(n, None, [n])},
        )
        for n in range(3)
    ]
    singles = [
        sample_dict(
            index=i,
            group_index=0,
            reward=float(i % 2),
            metadata={"leaf": leaf_descriptor(9, None, [9])},
        )
        for i in (41, 42)
    ]
    write_dump(root / "rollout_data" / "5.pt", 5, leaves + singles)
    write_dump(root / "rollout_data" / "eval_5.pt", 5, singles)
    (root / "dashboard_columns").mkdir(parents=True)
    return root


def test_dump_folder_builds_into_shards(tmp_path: Path) -> None:
    dump = v2_dump(tmp_path / "dump")
    out = tmp_path / "out"
    result = cli("build", dump, "--out", out, "--global-batch-size", "2")
    assert result.returncode == 0, result.stderr
    assert "note: " in result.stderr and "eval_5.pt" in result.stderr
    manifest = json.loads((out / "step=5" / "manifest.json").read_text())
    assert manifest["is_compact"] is True
    assert manifest["counts"]["written"] == 5
    shard = pl.read_parquet(out / "step=5" / "rank=0.parquet")
    assert shard.get_column("rollout_ids").to_list() == [40, 40, 40, 41, 42]
    assert shard.get_column("sample_indices").to_list() == [40, 40, 40, 41, 42]
    assert shard.get_column("rollout_mask_sums").to_list() == [6, 6, 6, 2, 2]


def test_session_version_flag_overrides_the_dump(tmp_path: Path) -> None:
    dump = v2_dump(tmp_path / "dump")
    result = cli("validate", dump, "--global-batch-size", "2", "--session-version", "v1")
    assert result.returncode == 1
    assert "rule rollout_id_only_on_v2_multi_leaf" in result.stderr
    assert "(40, 0), (40, 1), (40, 2)" in result.stderr


def test_a_save_debug_rollout_data_folder_builds_each_step(tmp_path: Path) -> None:
    """`--save-debug-rollout-data /run/rollout_{rollout_id}.pt` writes the dumps straight
    into a folder of the user's: that folder is an input too, one step per file."""
    run = tmp_path / "run"
    for step in (3, 4):
        rows = [sample_dict(index=i, group_index=i // 2, reward=float(i % 2)) for i in range(4)]
        write_dump(run / f"rollout_{step}.pt", step, rows)
    out = tmp_path / "out"
    result = cli("build", run, "--out", out, "--global-batch-size", "2")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.glob("step=*")) == ["step=3", "step=4"]
    for step in (3, 4):
        manifest = json.loads((out / f"step={step}" / "manifest.json").read_text())
        assert manifest["counts"]["written"] == 4
        assert [Path(i["path"]).name for i in manifest["inputs"]] == [f"rollout_{step}.pt"]


def test_a_table_root_beside_a_stray_dump_stays_a_table_root(tmp_path: Path) -> None:
    root = tmp_path / "rollouts"
    write_dump(root / "rollout_3.pt", 3, [sample_dict(index=0, group_index=0, reward=1.0)])
    pl.DataFrame(
        {"index": [0, 1], "status": ["completed"] * 2, "tokens": [[1, 2, 3]] * 2,
         "response_length": [1, 1], "reward": [0.0, 1.0]},
        schema_overrides={"tokens": pl.List(pl.Int32), "response_length": pl.Int32},
    ).write_parquet(root / "step=1.parquet")  # fmt: skip
    result = cli("validate", root, "--global-batch-size", "2")
    assert result.returncode == 0, result.stderr
    assert "step 1: valid, 2 rows" in result.stdout and "step 3" not in result.stdout

"""The output root reads as one dataset: every committed step's rank files, with `step`
and `rank`, one column set, through its dataset card (CONTRACT 7, docs/dataset.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import yaml

from pipeline import columns as c
from pipeline.step.write import BUILD_ID, DATASET_CARD, dataset_card
from tests.support.samples import build, sample, write_step


def _two_steps(tmp_path: Path) -> tuple[Path, dict[int, dict]]:
    """Step 1 with rollout log probs, step 2 with weight versions and train metadata, a
    quarantine in step 2, and a killed build's leftover folder; dp 2."""
    rows_1 = [sample(i, rollout_log_probs=[-0.5, -0.25], group_index=i // 2) for i in range(6)]
    rows_2 = [
        sample(
            10 + i,
            group_index=10 + i,  # a prompt each: the duplicate's group is its own (SEMANTICS 5.4)
            weight_versions=["3"] if i % 2 else [],
            train_metadata=json.dumps({"i": i}),
            reward=float(i % 2),
        )
        for i in range(4)
    ] + [sample(10, group_index=10, status="completed")]  # a duplicate index: quarantined
    out = tmp_path / "out"
    manifests = {}
    for step, rows in ((1, rows_1), (2, rows_2)):
        root = tmp_path / f"in{step}"
        write_step(root, rows, step=step)
        manifests[step] = build(root, out, global_batch_size=2, dp_size=2, on_invalid="quarantine")
    leftover = out / ".tmp-step=3-host-1-0123abcd"
    leftover.mkdir()
    pl.DataFrame({"tokens": [[1]]}).write_parquet(leftover / "rank=0.parquet")
    return out, manifests


def test_scan_parquet_reads_every_committed_step(tmp_path: Path) -> None:
    out, manifests = _two_steps(tmp_path)
    assert (out / "_quarantine" / "step=2.parquet").is_file()
    frame = pl.scan_parquet(out / "step=*" / "rank=*.parquet").collect()
    assert list(frame.schema.items()) == list(c.DATASET_SCHEMA.items())
    got = frame.group_by(c.STEP, c.RANK).len().sort(c.STEP, c.RANK).rows()
    want = [
        (m["step"], rank, o["rows"])
        for m in manifests.values()
        for rank, o in enumerate(m["outputs"][: m["settings"]["dp_size"]])
    ]
    assert got == want
    assert manifests[1]["present_columns"] == ["rollout_log_probs"]
    assert manifests[2]["present_columns"] == ["weight_versions", "metadata"]
    for step, manifest in manifests.items():
        rows = frame.filter(pl.col(c.STEP) == step)
        for name in c.OPTIONAL_SHARD_COLUMNS:
            nulls = rows.get_column(name).null_count()
            assert (nulls == 0) if name in manifest["present_columns"] else (nulls == rows.height)


def test_load_dataset_reads_every_committed_step(tmp_path: Path) -> None:
    import datasets

    out, manifests = _two_steps(tmp_path)
    loaded = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "hf"))
    assert list(loaded) == ["train"]
    table = loaded["train"].to_polars()
    assert table.columns == list(c.DATASET_COLUMNS)
    written = {m["step"]: m["counts"]["written"] for m in manifests.values()}
    assert dict(table.group_by(c.STEP).len().iter_rows()) == written
    assert set(table.get_column(c.RANK).to_list()) == {0, 1}
    # the same rows as the rank files, in file order
    direct = pl.concat(
        [pl.read_parquet(p) for p in sorted(out.glob("step=*/rank=*.parquet"))]
    ).with_columns(pl.col(c.WEIGHT_VERSIONS).cast(pl.List(pl.String)))
    assert table.select(direct.columns).cast(dict(direct.schema)).equals(direct)


def test_dataset_card_names_the_rank_files_and_every_column(tmp_path: Path) -> None:
    out, _ = _two_steps(tmp_path)
    text = (out / DATASET_CARD).read_text()
    build = BUILD_ID.search(text)
    assert build is not None and text == dataset_card(build.group(1))
    front = yaml.safe_load(text.split("---\n")[1])
    files = [{"split": "train", "path": "step=*/rank=*.parquet"}]
    (config,) = front["configs"]
    assert config == {
        "config_name": "default",
        "description": f"rollout-shards build {build.group(1)}: changes with every committed "
        "step, so that datasets never serves an earlier build from its cache",
        "data_files": files,
    }
    assert front["pretty_name"] == "Training shards (rollout-shards)"
    assert front["license"] == "other"
    for name in c.DATASET_COLUMNS:
        assert f"| `{name}` |" in text
    # rewritten by a rename: no temporary file is left beside it
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == [DATASET_CARD]


RANK_ROWS_SEEN_BY_RAY = """
import logging, sys
import ray
ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level=logging.ERROR,
         log_to_driver=False)
dataset = ray.data.read_parquet(sys.argv[1])
print(dataset.count(), sorted(dataset.schema().names))
"""


def _written(manifests: dict[int, dict]) -> int:
    return sum(m["counts"]["written"] for m in manifests.values())


def test_the_whole_root_read_by_common_readers_is_the_rank_rows(tmp_path: Path) -> None:
    """pyarrow's dataset, Ray Data, Hugging Face datasets and a Polars glob over the output
    root see exactly the rank files' rows with one type per column: the quarantine (under
    `_quarantine/`), staging and leftover folders (dot-prefixed) are not training data."""
    import subprocess
    import sys

    import pyarrow.dataset as ds

    out, manifests = _two_steps(tmp_path)
    assert manifests[2]["counts"]["quarantined"] > 0
    columns = sorted(c.DATASET_COLUMNS)

    table = ds.dataset(out, format="parquet", exclude_invalid_files=True).to_table()
    assert (table.num_rows, sorted(table.column_names)) == (_written(manifests), columns)
    assert str(table.schema.field(c.STEP).type) == "int64"
    hive = ds.partitioning(flavor="hive", schema=table.schema.empty_table().select([c.STEP]).schema)
    partitioned = ds.dataset(out, format="parquet", exclude_invalid_files=True, partitioning=hive)
    assert partitioned.to_table().num_rows == _written(manifests)

    frame = pl.scan_parquet(out / "step=*" / "rank=*.parquet", hive_partitioning=True).collect()
    assert frame.height == _written(manifests)
    assert frame.schema[c.STEP] == pl.Int64

    ray = subprocess.run(
        [sys.executable, "-c", RANK_ROWS_SEEN_BY_RAY, str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ray.returncode == 0, ray.stderr[-2000:]
    assert ray.stdout.strip().splitlines()[-1] == f"{_written(manifests)} {columns}"


LOAD_IN_ONE_CACHE = """
import json, sys
import datasets
datasets.disable_progress_bars()
train = datasets.load_dataset(sys.argv[1])["train"]
print(json.dumps({"rows": train.num_rows, "steps": sorted(set(train["step"]))}))
"""


def _load_with_home(root: Path, home: Path) -> dict[str, Any]:
    """`datasets.load_dataset(root)` in a process whose HF_HOME is `home`, as a user's is:
    one cache for every load."""
    done = subprocess.run(
        [sys.executable, "-c", LOAD_IN_ONE_CACHE, str(root)],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1"},
        check=True,
    )
    return json.loads(done.stdout.splitlines()[-1])


def test_load_dataset_reads_the_current_build_in_a_persistent_cache(tmp_path: Path) -> None:
    """One HF cache, as a user has: a root built with one step, loaded, rebuilt with four
    steps, loaded again, gives the four steps; a second root of the same folder name gives
    its own rows, and the first root loads unchanged again (from the cache)."""
    home = tmp_path / "hf"
    data = tmp_path / "rollouts"
    for step in range(1, 5):  # step 1 of 8 rows, the others of 4
        write_step(data, [sample(i, step=step) for i in range(8 if step == 1 else 4)], step=step)
    one_step = tmp_path / "one"
    write_step(one_step, [sample(i) for i in range(4)], step=1)
    first = tmp_path / "a" / "shards"
    build(one_step, first, global_batch_size=2)
    assert _load_with_home(first, home) == {"rows": 4, "steps": [1]}
    for step in range(1, 5):
        build(data / f"step={step}.parquet", first, global_batch_size=2)
    assert _load_with_home(first, home) == {"rows": 20, "steps": [1, 2, 3, 4]}
    second = tmp_path / "b" / "shards"
    build(data / "step=2.parquet", second, global_batch_size=2)
    assert _load_with_home(second, home) == {"rows": 4, "steps": [2]}
    assert _load_with_home(first, home) == {"rows": 20, "steps": [1, 2, 3, 4]}

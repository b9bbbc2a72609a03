"""read_rank reads what the step's build wrote, or raises one error naming the file:
tampered, foreign, miscounted, symlinked and misplaced files, manifests of another step;
a rebuild racing hundreds of reads never yields a mix of two builds."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import rollout_shards_loader._step as step_reader
import rollout_shards_loader._verify as verifier
from rollout_shards_loader import (
    ShardVerificationError,
    StepNotBuiltError,
    StepRefusedError,
    read_manifest,
    read_rank,
    wait_for_step,
)

from pipeline.io import writer
from tests.support.loader import bits, refuse_step, rewrite_manifest
from tests.support.samples import REPO, build, sample, write_step


def _step(tmp_path: Path, name: str = "out", reward: float = 1.0, n: int = 8) -> Path:
    rows = [
        sample(i, reward=reward * (i % 3), group_index=i // 4, response_length=1 + i % 50)
        for i in range(n)
    ]
    write_step(tmp_path / f"in-{name}", rows)
    build(tmp_path / f"in-{name}", tmp_path / name, global_batch_size=4, dp_size=2)
    return tmp_path / name / "step=1"


def test_a_changed_rank_file_is_named(tmp_path: Path) -> None:
    """A rank file rewritten with the same rows in other bytes: its rank's reader refuses
    it by its sha256, also after this process verified the file once (it knows the file
    by its identity, which the rewrite changed); another rank's reader checks the two
    columns it reads of it, which are still the build's values."""
    folder = _step(tmp_path)
    want = read_rank(folder, 0)
    read_rank(folder, 1)
    path = folder / "rank=1.parquet"
    table = pq.read_table(path)
    pq.write_table(table, path, compression="snappy")  # same rows, other bytes
    with pytest.raises(ShardVerificationError, match=r"rank=1\.parquet: its sha256"):
        read_rank(folder, 1)
    assert read_rank(folder, 0) == want
    assert read_rank(folder, 1, verify=False)["sample_indices"] == [1, 3, 5, 7]


def test_a_rank_file_of_another_build_is_named(tmp_path: Path) -> None:
    folder = _step(tmp_path)
    other = _step(tmp_path, "other", reward=2.0)
    shutil.copy(other / "rank=0.parquet", folder / "rank=0.parquet")
    with pytest.raises(ShardVerificationError, match=r"step=1/rank=0\.parquet: its sha256"):
        read_rank(folder, 0)
    with pytest.raises(
        ShardVerificationError, match=r"step=1/rank=0\.parquet: its batch_position and raw_rew"
    ):
        read_rank(folder, 1)


def _rewrite_column(path: Path, name: str, values: pa.Array) -> None:
    """Replace one column of a rank file, written with the shards' Parquet options."""
    table = pq.read_table(path)
    table = table.set_column(table.schema.get_field_index(name), name, values)
    pq.write_table(table, path, compression="zstd", compression_level=1, row_group_size=1024)


TAMPERED = {
    "one raw_reward": ("raw_reward", lambda v: [v[0] + 0.5, *v[1:]], pa.float64()),
    "a raw_reward set to null": ("raw_reward", lambda v: [None, *v[1:]], pa.float64()),
    "-0.0 for 0.0": ("raw_reward", lambda v: [-0.0 if x == 0 else x for x in v], pa.float64()),
    "raw_reward as float32": ("raw_reward", lambda v: v, pa.float32()),
    "two batch positions swapped": ("batch_position", lambda v: [v[1], v[0], *v[2:]], None),
}


@pytest.mark.parametrize("change", TAMPERED)
def test_a_tampered_column_of_another_ranks_file_is_named(tmp_path: Path, change: str) -> None:
    """Rank 0 reads `batch_position` and `raw_reward` of rank 1's file for the batch-wide
    `raw_reward`: a change to those values (or their type) is refused naming that file,
    by the manifest's digest of those columns (the file's sha256 is not taken)."""
    folder = _step(tmp_path)
    path = folder / "rank=1.parquet"
    name, edit, kind = TAMPERED[change]
    values = pq.read_table(path).column(name).to_pylist()
    assert 0.0 in pq.read_table(path).column("raw_reward").to_pylist()  # -0.0 changes one
    _rewrite_column(path, name, pa.array(edit(values), kind or pa.int64()))
    with pytest.raises(
        ShardVerificationError,
        match=r"step=1/rank=1\.parquet: its batch_position and raw_reward are not the manif",
    ):
        read_rank(folder, 0)
    with pytest.raises(ShardVerificationError, match=r"rank=1\.parquet: its sha256"):
        read_rank(folder, 1)


def test_a_damaged_column_of_another_ranks_file_is_named(tmp_path: Path) -> None:
    """Bytes overwritten inside the `raw_reward` pages of rank 1's file (its footer intact):
    rank 0's read of that column fails in pyarrow, and the error names the file."""
    folder = _step(tmp_path)
    path = folder / "rank=1.parquet"
    chunk = pq.ParquetFile(path).metadata.row_group(0)
    names = [chunk.column(i).path_in_schema for i in range(chunk.num_columns)]
    start = chunk.column(names.index("raw_reward")).data_page_offset
    data = bytearray(path.read_bytes())
    data[start : start + 24] = b"\xff" * 24
    path.write_bytes(bytes(data))
    with pytest.raises(ShardVerificationError, match=r"step=1/rank=1\.parquet: its sha256"):
        read_rank(folder, 0)


def test_a_manifest_without_the_column_digest_checks_whole_files(tmp_path: Path) -> None:
    """A manifest written before `raw_reward_sha256` existed reads the same, and another
    rank's file is then checked by its sha256: the same values in other bytes are
    refused."""
    folder = _step(tmp_path)
    want = [read_rank(folder, rank) for rank in range(2)]
    manifest = json.loads((folder / "manifest.json").read_text())
    for output in manifest["outputs"]:
        del output["raw_reward_sha256"]
    rewrite_manifest(folder, manifest, seal=False)
    verifier._VERIFIED.clear()
    assert [read_rank(folder, rank) for rank in range(2)] == want
    path = folder / "rank=1.parquet"
    pq.write_table(pq.read_table(path), path, compression="snappy")  # same rows, other bytes
    with pytest.raises(ShardVerificationError, match=r"rank=1\.parquet: its sha256"):
        read_rank(folder, 0)


@pytest.mark.parametrize(
    "rewards",
    [
        [0.5, -1.25, 3.0],
        [None, 0.0, -0.0, float("nan"), float("inf")],
        [],
        [float(i) / 7 for i in range(2500)],
    ],
)
def test_the_writer_and_the_loader_compute_one_digest(rewards: list[float | None]) -> None:
    """pipeline.io.writer's `raw_reward_sha256` of the frame written equals the loader's of
    the columns read back from the file (several row groups, nulls, NaN, signed zeros)."""
    positions = list(range(len(rewards)))[::-1]
    frame = pl.DataFrame(
        {"batch_position": positions, "raw_reward": rewards},
        schema={"batch_position": pl.Int64, "raw_reward": pl.Float64},
    )
    buffer = io.BytesIO()
    frame.write_parquet(buffer, **writer.PARQUET_OPTIONS)
    buffer.seek(0)
    table = pq.read_table(buffer)
    assert table.column("raw_reward").num_chunks == max(1, -(-len(rewards) // 1024))
    digest = writer.raw_reward_sha256(frame)
    assert verifier._raw_reward_sha256(table) == digest
    if rewards:  # each value flipped in sign (NaN and the null kept): another digest
        flipped = frame.with_columns(-pl.col("raw_reward"))
        assert writer.raw_reward_sha256(flipped) != digest


def test_a_row_count_other_than_the_manifests(tmp_path: Path) -> None:
    folder = _step(tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["outputs"][0]["rows"] += 1
    manifest["counts"]["written"] += 1
    rewrite_manifest(folder, manifest)
    with pytest.raises(
        ShardVerificationError, match=r"rank=0\.parquet: 4 rows, the manifest says 5"
    ):
        read_rank(folder, 0)


def test_a_manifest_of_another_step(tmp_path: Path) -> None:
    folder = _step(tmp_path)
    moved = folder.with_name("step=5")
    folder.rename(moved)
    with pytest.raises(
        ShardVerificationError, match=r"manifest of step 1, in the folder of step 5"
    ):
        read_rank(moved, 0)
    (tmp_path / "out" / "step=7").symlink_to(moved)
    with pytest.raises(ShardVerificationError, match="in the folder of step 7"):
        read_rank(tmp_path / "out" / "step=7", 0)


def test_a_symlinked_rank_file_is_refused(tmp_path: Path) -> None:
    folder = _step(tmp_path)
    outside = tmp_path / "elsewhere.parquet"
    shutil.move(folder / "rank=1.parquet", outside)
    (folder / "rank=1.parquet").symlink_to(outside)  # the same bytes, outside the folder
    for verify in (True, False):
        with pytest.raises(ShardVerificationError, match=r"rank=1\.parquet: a symbolic link"):
            read_rank(folder, 0, verify=verify)


def test_a_symlinked_manifest_is_refused(tmp_path: Path) -> None:
    folder = _step(tmp_path)
    outside = tmp_path / "manifest.json"
    shutil.move(folder / "manifest.json", outside)
    (folder / "manifest.json").symlink_to(outside)
    with pytest.raises(ShardVerificationError, match=r"step=1/manifest\.json: a symbolic link"):
        read_rank(folder, 0)


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_file_that_is_not_parquet_is_named(tmp_path: Path, rank: int) -> None:
    """Garbage in rank 1's file: named as not the manifest's, whether the reader reads it
    whole (rank 1) or for two columns (rank 0)."""
    folder = _step(tmp_path)
    (folder / "rank=1.parquet").write_bytes(b"not parquet" * 100)
    with pytest.raises(ShardVerificationError, match=r"rank=1\.parquet: its sha256"):
        read_rank(folder, rank)


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_rank_file_that_is_no_file_is_named(tmp_path: Path, kind: str) -> None:
    folder = _step(tmp_path)
    (folder / "rank=1.parquet").unlink()
    if kind == "fifo":  # opening a FIFO for reading would wait for a writer
        os.mkfifo(folder / "rank=1.parquet")
    else:
        (folder / "rank=1.parquet").mkdir()
    with pytest.raises(ShardVerificationError, match=r"rank=1\.parquet: not a regular file"):
        read_rank(folder, 0)


def test_a_manifest_of_another_shape_is_named(tmp_path: Path) -> None:
    folder = _step(tmp_path)
    (folder / "manifest.json").write_text(json.dumps({"step": 1}))
    with pytest.raises(ShardVerificationError, match="manifest.json: not a rollout-shards"):
        read_rank(folder, 0)
    (folder / "manifest.json").write_text("{")
    with pytest.raises(ShardVerificationError, match="manifest.json: not a JSON manifest"):
        read_rank(folder, 0)


WRONG_TYPES = {
    "step": ("step", True),
    "step as a string": ("step", "1"),
    "step as a float": ("step", 1.0),
    "settings.dp_size": ("settings.dp_size", True),
    "settings.global_batch_size": ("settings.global_batch_size", "4"),
    "settings.trainer": ("settings.trainer", 1),
    "outputs[0].rows": ("outputs.0.rows", True),
    "outputs[1].sha256": ("outputs.1.sha256", 7),
    "outputs[0].raw_reward_sha256": ("outputs.0.raw_reward_sha256", False),
    "outputs[0]": ("outputs.0", "rank=0.parquet"),
    "present_columns": ("present_columns", "weight_versions"),
    "num_microbatches": ("num_microbatches", [1, True]),
    "num_rollouts": ("num_rollouts", None),
    "dynamic_global_batch_size": ("dynamic_global_batch_size", 4.0),
    "dropped_positions": ("dropped_positions", [False]),
    "dropped_raw_reward": ("dropped_raw_reward", ["0.5"]),
}


@pytest.mark.parametrize("case", sorted(WRONG_TYPES))
def test_a_manifest_field_of_another_json_type_is_named(tmp_path: Path, case: str) -> None:
    """`"step": true` is not step 1, nor `"4"` the integer 4: a field the loader reads
    that is not of the type the build writes is one error naming the field, for
    `read_rank` and `read_manifest` alike."""
    folder = _step(tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    where, value = WRONG_TYPES[case]
    *parents, last = [int(k) if k.isdigit() else k for k in where.split(".")]
    record = manifest
    for key in parents:
        record = record[key]
    record[last] = value
    (folder / "manifest.json").write_text(json.dumps(manifest))
    field = re.escape(f"`{case.split()[0]}` is {json.dumps(value)} (JSON ")
    for read in (lambda: read_rank(folder, 0), lambda: read_manifest(folder)):
        with pytest.raises(ShardVerificationError, match=rf"manifest\.json: {field}") as error:
            read()
        assert "\n" not in str(error.value)


def test_a_manifest_of_inconsistent_fields_is_named(tmp_path: Path) -> None:
    folder = _step(tmp_path)
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    rewrite_manifest(folder, {**manifest, "dropped_raw_reward": [0.5]})
    with pytest.raises(ShardVerificationError, match="1 values for 0 `dropped_positions`"):
        read_rank(folder, 0)
    # a batch position given twice would leave a value of the batch-wide raw_reward unset
    counts = {**manifest["counts"], "dropped": 1}
    twice = {"dropped_positions": [0], "dropped_raw_reward": [1], "counts": counts}
    rewrite_manifest(folder, {**manifest, **twice})
    with pytest.raises(ShardVerificationError, match=r"not each of 0\.\.8 once"):
        read_rank(folder, 0)
    slime = {**manifest["settings"], "trainer": "slime"}
    rewrite_manifest(folder, {**manifest, "settings": slime, "num_microbatches": [2, 2]})
    with pytest.raises(
        ValueError, match=r"not miles: read its ranks with rollout_shards_loader\.slime"
    ):
        read_rank(folder, 0)
    rewrite_manifest(folder, {**manifest, "settings": {**slime, "trainer": "torchtitan"}})
    with pytest.raises(ShardVerificationError, match="which this loader does not read"):
        read_rank(folder, 0)
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ShardVerificationError, match="manifest.json: not a JSON manifest"):
        read_rank(folder, 0)
    path.write_text("[1]")
    with pytest.raises(ShardVerificationError, match="not a rollout-shards manifest"):
        read_manifest(folder)


def test_a_missing_rank_file_and_a_missing_step(tmp_path: Path) -> None:
    folder = _step(tmp_path)
    (folder / "rank=1.parquet").unlink()
    with pytest.raises(FileNotFoundError, match=r"step=1/rank=1\.parquet"):
        read_rank(folder, 1)
    with pytest.raises(FileNotFoundError, match="no such step folder"):
        read_rank(tmp_path / "out" / "step=9", 0)


def test_train_step_on_request(tmp_path: Path) -> None:
    # 11 rows, trim off, G 4, dp 1: steps 0 and 1 train 8 rows, 3 are never trained
    rows = [sample(i, reward=float(i)) for i in range(11)]
    write_step(tmp_path / "in", rows)
    build(tmp_path / "in", tmp_path / "out", global_batch_size=4, disable_rollout_trim_samples=True)
    folder = tmp_path / "out" / "step=1"
    plain = read_rank(folder, 0)
    assert "train_step" not in plain
    got = read_rank(folder, 0, with_train_step=True)
    assert got["train_step"] == [0] * 4 + [1] * 4 + [None] * 3
    assert {k: v for k, v in got.items() if k != "train_step"} == plain
    numpy = read_rank(folder, 0, as_numpy=True, with_train_step=True)["train_step"]
    assert isinstance(numpy, np.ma.MaskedArray) and numpy.dtype == np.int32
    assert numpy.tolist() == got["train_step"]


REBUILDER = """
import sys, time
from pathlib import Path
from typing import Any
from pipeline.io.discovery import find_sources
from pipeline.io.load import group_steps
from pipeline.settings import load_settings
from pipeline.step.build import build_step
out, stop, count = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
config = load_settings(global_batch_size=4, dp_size=2)
builds = 0
while not stop.exists():
    for name in ("in-a", "in-b"):
        ((step, sources),) = group_steps(find_sources([out.parent / name])).items()
        build_step(step, sources, config, out)
        builds += 1
        # replaced whole: the test reads it while builds go on (a rewrite in place can be
        # read empty)
        count.with_suffix(".tmp").write_text(str(builds))
        count.with_suffix(".tmp").replace(count)
"""


def test_rebuilds_racing_hundreds_of_reads_never_mix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One process rebuilds the step over and over from two different inputs while this
    one reads it: every read is wholly one build's, also the reads during which the
    folder was swapped (counted, and awaited: at least three)."""
    raced = []
    once = step_reader.read_once

    def counted(*args: Any) -> Any:
        try:
            return once(*args)
        except step_reader.Replaced:
            raced.append(1)
            raise

    monkeypatch.setattr(step_reader, "read_once", counted)
    folder_a = _step(tmp_path, "a", reward=1.0, n=400)
    folder_b = _step(tmp_path, "b", reward=-3.0, n=400)
    wants = [
        {json.dumps(bits(read_rank(f, rank))): f.parent.name for f in (folder_a, folder_b)}
        for rank in range(2)
    ]
    assert all(len(w) == 2 for w in wants)
    out = tmp_path / "raced"
    shutil.copytree(folder_a.parent, out)
    stop, count = tmp_path / "stop", tmp_path / "count"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    rebuilder = subprocess.Popen(
        [sys.executable, "-c", REBUILDER, str(out), str(stop), str(count)], env=env
    )
    try:
        started = time.monotonic() + 300
        while not count.exists():
            assert rebuilder.poll() is None, "the rebuilding process ended"
            assert time.monotonic() < started, "the rebuilding process built nothing"
            time.sleep(0.05)
        last, switches, reads = None, 0, 0
        deadline = time.monotonic() + 120
        while reads < 400 or switches < 10 or len(raced) < 3:
            rank = reads % 2
            got = json.dumps(bits(read_rank(out / "step=1", rank)))
            assert got in wants[rank], f"read {reads} mixes two builds"
            build = wants[rank][got]
            switches += last is not None and build != last
            last, reads = build, reads + 1
            assert time.monotonic() < deadline, f"{len(raced)} races in {reads} reads"
        builds = int(count.read_text() or 0)
    finally:
        stop.touch()
        rebuilder.wait(timeout=120)
    assert rebuilder.returncode == 0
    assert builds >= 4  # the step was replaced again and again during the reads


def test_wait_for_step_returns_for_a_built_step_and_names_the_build_otherwise(
    tmp_path: Path,
) -> None:
    folder = _step(tmp_path)
    started = time.monotonic()
    wait_for_step(folder, 600)
    assert time.monotonic() - started < 5
    with pytest.raises(StepNotBuiltError, match=r"step=2: the step is not built .* waiting 0 s"):
        wait_for_step(folder.with_name("step=2"), 0)


def test_waiting_on_a_refused_step_fails_at_once_quoting_the_rule(tmp_path: Path) -> None:
    """A refused step will not come: `wait_for_step` fails within a second (not after its
    wait) with the refusal's first line and the command that shows it all, and
    `read_rank` of it says the same; once a build commits the step, both read it."""
    folder = refuse_step(tmp_path, tmp_path / "out")
    started = time.monotonic()
    with pytest.raises(StepRefusedError) as refused:
        wait_for_step(folder, 600)
    assert time.monotonic() - started < 1
    message = str(refused.value)
    assert "\n" not in message
    assert "rule reward_finite: reward must be a finite number on every row" in message
    assert f"`rollout-shards validate {tmp_path / 'out'}` shows it all" in message
    with pytest.raises(StepRefusedError, match="rule reward_finite"):
        read_rank(folder, 0)
    rows = [sample(i, reward=1.0) for i in range(4)]
    write_step(tmp_path / "bad-2", rows, step=2)
    build(tmp_path / "bad-2", tmp_path / "out", global_batch_size=2, dp_size=2)
    wait_for_step(folder, 0)
    assert read_rank(folder, 0)["sample_indices"] == [0, 2]

"""`rollout-shards metrics`: a root's per-step metrics as TensorBoard event files, read back
by TensorBoard's own reader, and as JSON Lines."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub import pywrap_tensorflow

from pipeline import metrics_export as export
from tests.support.samples import REPO, build, sample, write_step

ROLLOUT_STEP = "rollout/step"


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """The installed program, as a user runs it (this checkout first on the path)."""
    program = Path(sys.executable).parent / "rollout-shards"
    command = [str(program)] if program.exists() else [sys.executable, "-m", "pipeline.cli"]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [*command, *map(str, args)], capture_output=True, text=True, cwd=REPO, env=env, check=False
    )


def _rows(rewards: list[float]) -> list[dict[str, object]]:
    return [
        sample(i, group_index=i // 2, reward=r, response_length=1 + i % 3)
        for i, r in enumerate(rewards)
    ]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """An output root with steps 2 and 10 committed (numeric order differs from text
    order), a step folder without manifest and a staging folder, which are no steps."""
    out = tmp_path / "shards"
    for step, rewards in ((10, [1.0, 0.0, 1.0, 1.0, 0.0, 0.0]), (2, [0.0, 0.0, 1.0, 0.0])):
        inputs = tmp_path / f"in{step}"
        write_step(inputs, _rows(rewards), step=step)
        build(inputs, out, global_batch_size=2, n_samples_per_prompt=2)
    (out / "step=11").mkdir()
    (out / ".tmp-step=12-host-1-ab").mkdir()
    return out


def _stats(root: Path, step: int) -> dict[str, float]:
    stats = json.loads((root / f"step={step}" / "manifest.json").read_text())["stats"]
    assert isinstance(stats, dict)
    return stats


def test_root_metrics_are_the_committed_manifests_by_step(root: Path) -> None:
    steps = export.root_metrics(root)
    assert [s.step for s in steps] == [2, 10]
    for s in steps:
        assert s.stats == _stats(root, s.step)
        assert s.wall_time == (root / f"step={s.step}" / "manifest.json").stat().st_mtime
    # a step folder alone is a root of one step
    assert [s.step for s in export.root_metrics(root / "step=10")] == [10]


def test_event_file_reads_back_with_tensorboard(root: Path, tmp_path: Path) -> None:
    steps = export.root_metrics(root)
    path = export.write_tensorboard(steps, tmp_path / "tb")
    assert path.parent == tmp_path / "tb" and "tfevents" in path.name
    reader = EventAccumulator(str(tmp_path / "tb"))
    reader.Reload()
    stats = {s.step: s.stats for s in steps}
    names = (set(stats[2]) | set(stats[10])) - {ROLLOUT_STEP}
    assert {"rollout/episode_raw_reward", "passrate/pass@1", "rollout/raw_reward"} <= names
    assert "rollout/zero_std/count_1.0" in set(stats[10]) - set(stats[2])
    # every metric but the step key, whose value is each event's step (as miles logs them)
    assert set(reader.Tags()["scalars"]) == names
    wall_time = {s.step: s.wall_time for s in steps}
    for name in names:
        events = reader.Scalars(name)
        # SummaryWriter.add_scalar's float32, at the step, from the steps that have it
        assert [(e.step, e.value, e.wall_time) for e in events] == [
            (s, float(np.float32(stats[s][name])), wall_time[s])
            for s in (2, 10)
            if name in stats[s]
        ], name
    assert reader.Scalars("rollout/num_training_samples")[0].value == 4.0
    assert reader.Scalars("rollout/episode_raw_reward")[1].value == 0.5


def test_events_are_event_protos_in_checked_records(tmp_path: Path) -> None:
    """The framing is TFRecord's (TensorBoard's reader verifies each CRC) and each record
    parses as TensorBoard's Event message."""
    assert export.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    for data in (b"", b"a", bytes(range(256)) * 3):
        assert export.masked_crc32c(data) == pywrap_tensorflow.masked_crc32c(data)
    steps = [
        export.StepMetrics(3, {ROLLOUT_STEP: 3.0, "a": 1e300, "b": -0.1}, 1.5),
        export.StepMetrics(2**40, {"a": 2.0}, 2.5),
    ]
    data = export.events_bytes(steps)
    records = []
    while data:
        (length,) = struct.unpack("<Q", data[:8])
        records.append(event_pb2.Event.FromString(data[12 : 12 + length]))
        data = data[16 + length :]
    assert [r.step for r in records] == [0, 3, 2**40]
    assert records[0].file_version == "brain.Event:2" and records[0].wall_time == 1.5
    values = {v.tag: v.simple_value for v in records[1].summary.value}
    assert values == {"a": float("inf"), "b": float(np.float32(-0.1))}  # float32, as miles'
    assert records[2].wall_time == 2.5
    # a changed byte is refused by TensorBoard's reader
    folder = tmp_path / "tb"
    path = export.write_tensorboard(steps, folder)
    raw = bytearray(path.read_bytes())
    raw[-6] ^= 0xFF
    path.write_bytes(bytes(raw))
    reader = EventAccumulator(str(folder))
    reader.Reload()
    assert [e.step for e in reader.Scalars("a")] == [3]  # the last record is dropped


def test_jsonl_parses_back_one_object_per_step(root: Path, tmp_path: Path) -> None:
    steps = export.root_metrics(root)
    path = tmp_path / "metrics" / "rollout.jsonl"
    export.write_jsonl(steps, path)
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    for line, step in zip(lines, (2, 10), strict=True):
        record = json.loads(line)
        assert next(iter(record)) == ROLLOUT_STEP and record[ROLLOUT_STEP] == step
        assert type(record[ROLLOUT_STEP]) is int
        # full precision, every metric of the manifest
        assert record == {ROLLOUT_STEP: step} | _stats(root, step)


def test_cli_exports_both_and_a_rerun_replaces(root: Path, tmp_path: Path) -> None:
    tb, jsonl = tmp_path / "tb", tmp_path / "m.jsonl"
    for _ in range(2):
        done = cli("metrics", root, "--tensorboard", tb, "--jsonl", jsonl)
        assert done.returncode == 0, done.stderr
        assert done.stderr == ""
        assert done.stdout == (
            f"rollout-shards: metrics: 2 steps (2..10) of {root} to "
            f"{tb / export.EVENTS_FILE} and {jsonl}\n"
        )
    assert [p.name for p in tb.iterdir()] == [export.EVENTS_FILE]  # no staged leftovers
    reader = EventAccumulator(str(tb))
    reader.Reload()
    assert [e.step for e in reader.Scalars("rollout/raw_reward")] == [2, 10]  # not twice
    assert [json.loads(line)[ROLLOUT_STEP] for line in jsonl.read_text().splitlines()] == [2, 10]
    printed = cli("metrics", root / "step=2", "--jsonl", "-")
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout) == {ROLLOUT_STEP: 2} | _stats(root, 2)


def test_root_alone_prints_a_table_of_every_metric_per_step(root: Path) -> None:
    done = cli("metrics", root)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    header, *rows = done.stdout.splitlines()
    assert header.split() == ["metric", "step", "2", "step", "10"]
    table = {row.split()[0]: row.split()[1:] for row in rows}
    two, ten = _stats(root, 2), _stats(root, 10)
    assert set(table) == (set(two) | set(ten)) - {ROLLOUT_STEP}
    assert table["rollout/num_training_samples"] == ["4", "6"]
    for name, (left, right) in table.items():
        for cell, stats in ((left, two), (right, ten)):
            if name not in stats:
                assert cell == "-"
            else:
                assert float(cell) == pytest.approx(stats[name], rel=1e-5)
    # the numbers right-aligned under their step
    assert {len(row) for row in done.stdout.splitlines()} == {len(header)}


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["{tmp}/nowhere", "--jsonl", "{tmp}/m.jsonl"], 2, "{tmp}/nowhere does not exist"),
        (["{tmp}/empty", "--jsonl", "{tmp}/m.jsonl"], 2, "no committed step"),
        (["{tmp}/nowhere"], 2, "{tmp}/nowhere does not exist"),
        (
            ["{root}", "--tensorboard", "{tmp}/a-file", "--jsonl", "{tmp}/m.jsonl"],
            2,
            "--tensorboard {tmp}/a-file is a file, not a folder",
        ),
        (
            ["{tmp}/broken", "--tensorboard", "{tmp}/tb", "--jsonl", "{tmp}/m.jsonl"],
            1,
            "{tmp}/broken/step=4/manifest.json: rule unreadable_file: not a step manifest",
        ),
    ],
)
def test_cli_errors_are_one_line_and_write_nothing(
    root: Path, tmp_path: Path, args: list[str], status: int, message: str
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "a-file").write_text("")
    (tmp_path / "broken" / "step=4").mkdir(parents=True)
    (tmp_path / "broken" / "step=4" / "manifest.json").write_text("{not json")
    done = cli("metrics", *(a.format(tmp=tmp_path, root=root) for a in args))
    assert done.returncode == status
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and message.format(tmp=tmp_path) in lines[0], done.stderr
    assert lines[0].startswith("rollout-shards: ")
    assert not (tmp_path / "tb").exists() and not (tmp_path / "m.jsonl").exists()


def test_events_read_back_as_miles_summary_writer_logs_them(root: Path, tmp_path: Path) -> None:
    """The same stats logged as miles' TensorBoard backend logs a rollout step (torch's
    SummaryWriter, `add_scalar(key, value, step)` for every key but `rollout/step`) read
    back exactly as the export does: same tags, steps and values."""
    from torch.utils.tensorboard import SummaryWriter  # the miles extra, which make installs

    steps = export.root_metrics(root)
    writer = SummaryWriter(str(tmp_path / "live"))
    for s in steps:
        for name, value in s.stats.items():
            if name != ROLLOUT_STEP:
                writer.add_scalar(name, value, s.step)
    writer.close()
    export.write_tensorboard(steps, tmp_path / "offline")
    readers = [EventAccumulator(str(tmp_path / run)) for run in ("live", "offline")]
    for reader in readers:
        reader.Reload()
    live, offline = readers
    assert sorted(offline.Tags()["scalars"]) == sorted(live.Tags()["scalars"])
    for name in live.Tags()["scalars"]:
        assert [(e.step, e.value) for e in offline.Scalars(name)] == [
            (e.step, e.value) for e in live.Scalars(name)
        ], name

"""SIGKILL at any moment of a build, and concurrent builds of one step (pipeline/io/writer.py).

A trainer looks at `step=<N>` folders only. Whatever happens, every such folder is
complete (its manifest is there and every file it lists has the listed sha256), private
leftovers are dot-prefixed and the next build removes them, and the rerun writes the
same bytes as an undisturbed build. Kill moments come from seeded generators; nothing
here asserts on time.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pipeline.io import writer
from pipeline.manifest import MANIFEST
from pipeline.step.write import BUILD_ID, DATASET_CARD, dataset_card
from tests.support.samples import REPO, dead_pid

ROWS = 80_000  # about one second of build on a laptop core, most of it after start-up
SETTINGS = ["--global-batch-size", "64", "--dp-size", "4"]
STEP_FOLDER = re.compile(r"^step=\d+$")


def big_step(root: Path, seed: int = 2536) -> Path:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, 32_000, (ROWS, 48), dtype=np.int32)
    frame = pl.DataFrame(
        {
            "index": np.arange(ROWS),
            "group_index": np.arange(ROWS) // 8,
            "status": "completed",
            "tokens": pl.Series(tokens).cast(pl.List(pl.Int32)),
            "response_length": rng.integers(1, 40, ROWS, dtype=np.int32),
            "reward": rng.integers(0, 2, ROWS).astype(np.float64),
        }
    )
    root.mkdir(parents=True)
    frame.write_parquet(root / "step=1.parquet")
    return root


def start(inputs: Path, out: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "build", str(inputs), "--out", str(out)]
        + [*SETTINGS, *extra],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    stdout, stderr = process.communicate()
    assert "Traceback" not in stderr, stderr
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def is_complete(folder: Path) -> bool:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    listed = {output["path"]: output["sha256"] for output in manifest["outputs"]}
    on_disk = digests(folder)
    return on_disk.pop(MANIFEST, None) is not None and on_disk == listed


def assert_trainer_sees_only_whole_steps(out: Path) -> None:
    if not out.exists():
        return
    for entry in out.iterdir():
        if entry.name.startswith("."):
            assert writer.PRIVATE.match(entry.name) or entry.name == writer.LOCK_FOLDER, entry.name
            continue
        if entry.name == writer.QUARANTINE_FOLDER:  # set-aside rows, not training data
            continue
        if entry.name == DATASET_CARD:  # replaced by a rename: whole or absent
            text = entry.read_text()
            assert text == dataset_card(BUILD_ID.search(text).group(1))
            continue
        assert STEP_FOLDER.match(entry.name), entry.name
        assert is_complete(entry), f"{entry} is partial: {sorted(os.listdir(entry))}"


def private(out: Path) -> list[str]:
    """Dot-prefixed entries other than the step locks (a killed build's leftovers, say)."""
    if not out.exists():
        return []
    names = (p.name for p in out.iterdir() if p.name != writer.LOCK_FOLDER)
    return sorted(name for name in names if name.startswith("."))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, float]:
    """The inputs, an undisturbed build of them, and how long that build took (to scale
    the kill moments, never asserted)."""
    root = tmp_path_factory.mktemp("crash")
    inputs = big_step(root / "rollouts")
    began = time.monotonic()
    result = finish(start(inputs, root / "reference"))
    assert result.returncode == 0, result.stderr
    return inputs, root / "reference" / "step=1", time.monotonic() - began


def kill_after(process: subprocess.Popen[str], delay: float) -> None:
    try:
        process.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGKILL)
    process.wait()


def kill_while_writing(process: subprocess.Popen[str], out: Path, delay: float) -> None:
    """Kill a moment after the staging folder appears (or when the build ends first)."""
    while process.poll() is None and not any(n.startswith(".tmp-") for n in private(out)):
        time.sleep(0.001)
    kill_after(process, delay)


# Where the kill lands: anywhere in a first build or a rebuild over a complete step, or
# in the short write-and-commit phase of either.
MODES = ("fresh", "replace", "fresh_writing", "replace_writing")


@pytest.mark.parametrize("round_", range(12))
def test_sigkill_at_a_random_moment(
    tmp_path: Path, reference: tuple[Path, Path, float], round_: int
) -> None:
    inputs, built, duration = reference
    rng = random.Random(2536 + round_)
    mode = MODES[round_ % len(MODES)]
    out = tmp_path / "shards"
    if mode.startswith("replace"):
        out.mkdir()
        shutil.copytree(built, out / "step=1")
    process = start(inputs, out, "--force")
    if mode.endswith("writing"):
        kill_while_writing(process, out, rng.uniform(0.0, 0.15))
    else:
        kill_after(process, rng.uniform(0.0, 1.2 * duration))

    assert_trainer_sees_only_whole_steps(out)
    if mode.startswith("replace"):
        # The swap is one system call: the old step or the new one is always there.
        assert is_complete(out / "step=1")

    rerun = finish(start(inputs, out))
    assert rerun.returncode == 0, rerun.stderr
    assert digests(out / "step=1") == digests(built)
    assert private(out) == []


@pytest.mark.parametrize("round_", range(3))
def test_two_builds_of_one_step_at_once_leave_one_whole_folder(
    tmp_path: Path, reference: tuple[Path, Path, float], round_: int
) -> None:
    inputs, built, _ = reference
    out = tmp_path / "shards"
    if round_ == 2:
        out.mkdir()
        shutil.copytree(built, out / "step=1")
    first, second = start(inputs, out, "--force"), start(inputs, out, "--force")
    results = [finish(first), finish(second)]
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    assert sorted(p.name for p in out.iterdir()) == [writer.LOCK_FOLDER, DATASET_CARD, "step=1"]
    assert digests(out / "step=1") == digests(built)


def test_next_build_removes_leftovers_of_dead_builds_only(
    tmp_path: Path, reference: tuple[Path, Path, float]
) -> None:
    inputs, built, _ = reference
    out = tmp_path / "shards"
    out.mkdir()
    dead = dead_pid()
    host = writer._host()
    names = {
        "dead_tmp": f".tmp-step=1-{host}-{dead}-0123abcd",
        "dead_old": f".old-step=1-{host}-{dead}-4567cdef",
        "live": f".tmp-step=1-{host}-{os.getpid()}-89ab0123",
        "other_host": f".tmp-step=1-elsewhere-{dead}-cdef4567",
        "not_ours": ".tmp-notes",
    }
    for name in names.values():
        (out / name).mkdir()
        (out / name / "rank=0.parquet").write_bytes(b"partial")
    result = finish(start(inputs, out))
    assert result.returncode == 0, result.stderr
    assert private(out) == sorted([names["live"], names["other_host"], names["not_ours"]])
    assert digests(out / "step=1") == digests(built)


def _staged(out: Path, content: bytes) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    staged = out / writer.private_name("tmp", "step=1")
    staged.mkdir()
    (staged / "rank=0.parquet").write_bytes(content)
    (staged / MANIFEST).write_text("{}")
    return staged


def test_commit_replaces_an_existing_folder_by_swapping(tmp_path: Path) -> None:
    final = writer.step_folder(tmp_path, 1)
    writer.commit_folder(_staged(tmp_path, b"old"), final)
    writer.commit_folder(_staged(tmp_path, b"new"), final)
    assert (final / "rank=0.parquet").read_bytes() == b"new"
    assert private(tmp_path) == []


def test_commit_without_renameat2_retires_the_old_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer, "_exchange", lambda a, b: None)
    final = writer.step_folder(tmp_path, 1)
    writer.commit_folder(_staged(tmp_path, b"old"), final)
    writer.commit_folder(_staged(tmp_path, b"new"), final)
    assert (final / "rank=0.parquet").read_bytes() == b"new"
    assert private(tmp_path) == []

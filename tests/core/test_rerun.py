"""Reruns: a current step folder is skipped, anything else is replaced whole, --force
rebuilds (pipeline/build.py `current_manifest`, `build_step`; `rollout-shards build`)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from pipeline.io.discovery import find_sources
from pipeline.io.load import group_steps
from pipeline.settings import load_settings
from pipeline.step.build import build_step
from pipeline.step.freshness import current_manifest
from tests.support.cli import cli
from tests.support.samples import REPO, sample, write_step

GBS = ["--global-batch-size", "2"]


def build_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return cli("build", *args)


def identity(folder: Path) -> dict[str, tuple[int, int]]:
    """Inode and modification time of every file: unchanged only if nothing was written."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture
def built(rows_dir: Path, tmp_path: Path) -> tuple[Path, Path]:
    write_step(rows_dir, [sample(i, reward=float(i % 2)) for i in range(4)])
    out = tmp_path / "shards"
    first = build_cli(rows_dir, "--out", out, *GBS)
    assert first.returncode == 0, first.stderr
    return rows_dir, out


def test_a_current_step_is_skipped_and_says_so(built: tuple[Path, Path]) -> None:
    rows_dir, out = built
    before = identity(out / "step=1")
    again = build_cli(rows_dir, "--out", out, *GBS)
    assert again.returncode == 0, again.stderr
    assert again.stdout == (
        f"step 1: up to date, skipped: {out / 'step=1'} was built from the same inputs "
        "and settings (--force rebuilds it)\n"
    )
    assert identity(out / "step=1") == before


def test_force_rebuilds_a_current_step_with_the_same_bytes(built: tuple[Path, Path]) -> None:
    rows_dir, out = built
    before, old = identity(out / "step=1"), contents(out / "step=1")
    again = build_cli(rows_dir, "--out", out, *GBS, "--force")
    assert again.returncode == 0, again.stderr
    assert "4 rows in" in again.stdout
    assert identity(out / "step=1") != before
    assert contents(out / "step=1") == old


def test_other_settings_replace_the_step(built: tuple[Path, Path]) -> None:
    rows_dir, out = built
    again = build_cli(rows_dir, "--out", out, *GBS, "--dp-size", "2")
    assert again.returncode == 0, again.stderr
    assert "written to 2 ranks" in again.stdout
    assert sorted(p.name for p in (out / "step=1").iterdir()) == [
        "manifest.json",
        "rank=0.parquet",
        "rank=1.parquet",
        "report.html",
    ]
    assert sorted(p.name for p in out.iterdir() if p.name != ".locks") == [
        "README.md",
        "step=1",
    ]  # the dataset card


def test_changed_inputs_replace_the_step(built: tuple[Path, Path]) -> None:
    rows_dir, out = built
    write_step(rows_dir, [sample(i, reward=float(i % 2)) for i in range(6)])
    again = build_cli(rows_dir, "--out", out, *GBS)
    assert again.returncode == 0, again.stderr
    manifest = json.loads((out / "step=1" / "manifest.json").read_text())
    assert manifest["counts"]["ingested"] == 6


def test_a_tampered_or_incomplete_folder_is_rebuilt(built: tuple[Path, Path]) -> None:
    rows_dir, out = built
    old = contents(out / "step=1")
    (out / "step=1" / "rank=0.parquet").write_bytes(b"not what the manifest says")
    assert "4 rows in" in build_cli(rows_dir, "--out", out, *GBS).stdout
    assert contents(out / "step=1") == old
    (out / "step=1" / "manifest.json").unlink()
    assert "4 rows in" in build_cli(rows_dir, "--out", out, *GBS).stdout
    assert contents(out / "step=1") == old


def test_an_invalid_rerun_leaves_the_last_good_step_alone(built: tuple[Path, Path]) -> None:
    rows_dir, out = built
    before = identity(out / "step=1")
    write_step(rows_dir, [sample(i, status="done") for i in range(4)])
    again = build_cli(rows_dir, "--out", out, *GBS)
    assert again.returncode == 1
    assert "rule status_isin" in again.stderr
    assert identity(out / "step=1") == before


def test_build_step_skips_a_current_step_unless_forced(rows_dir: Path, tmp_path: Path) -> None:
    write_step(rows_dir, [sample(i) for i in range(4)])
    ((step, sources),) = group_steps(find_sources([rows_dir])).items()
    settings, out = load_settings(global_batch_size=2), tmp_path / "shards"
    assert current_manifest(step, sources, settings, out) is None
    manifest = build_step(step, sources, settings, out)
    assert current_manifest(step, sources, settings, out) == manifest
    before = identity(out / "step=1")
    assert build_step(step, sources, settings, out) == manifest
    assert identity(out / "step=1") == before
    assert build_step(step, sources, settings, out, force=True) == manifest
    assert identity(out / "step=1") != before
    other = load_settings(global_batch_size=4)
    assert current_manifest(step, sources, other, out) is None


def test_a_moved_input_is_not_current(rows_dir: Path, tmp_path: Path) -> None:
    write_step(rows_dir, [sample(i) for i in range(4)])
    settings, out = load_settings(global_batch_size=2), tmp_path / "shards"
    ((step, sources),) = group_steps(find_sources([rows_dir])).items()
    build_step(step, sources, settings, out)
    moved = tmp_path / "moved"
    os.rename(rows_dir, moved)
    ((step, sources),) = group_steps(find_sources([moved])).items()
    assert current_manifest(step, sources, settings, out) is None


def _build_from(cwd: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """`rollout-shards build` run from the folder `cwd`, paths as typed there."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "loader")])}
    return cli("build", *args, cwd=cwd, env=env)


def test_a_current_step_is_skipped_whatever_the_working_folder(tmp_path: Path) -> None:
    """`build my/rollouts` from one folder, then `build rollouts` from inside `my/`: the
    inputs are the same files (the manifest records them resolved), so nothing is built."""
    write_step(tmp_path / "my" / "rollouts", [sample(i) for i in range(4)], step=1)
    first = _build_from(tmp_path, "my/rollouts", "--out", "shards", *GBS)
    assert first.returncode == 0, first.stderr
    folder = tmp_path / "shards" / "step=1"
    before = identity(folder)
    (record,) = json.loads((folder / "manifest.json").read_text())["inputs"]
    assert record["path"] == str((tmp_path / "my" / "rollouts" / "step=1.parquet").resolve())
    again = _build_from(tmp_path / "my", "rollouts", "--out", "../shards", *GBS)
    assert again.returncode == 0, again.stderr
    assert "step 1: up to date, skipped" in again.stdout
    assert identity(folder) == before


def test_a_moved_input_root_rebuilds_the_same_shards_and_a_moved_output_root_skips(
    tmp_path: Path,
) -> None:
    """The manifest names the inputs where they were: after the input root moves, its
    steps are built again (the same rank files; the manifest names the new place); an
    output root moved with its inputs in place is still current."""
    write_step(tmp_path / "rollouts", [sample(i) for i in range(4)], step=1)
    assert _build_from(tmp_path, "rollouts", "--out", "shards", *GBS).returncode == 0
    ranks = contents(tmp_path / "shards" / "step=1")
    (tmp_path / "shards").rename(tmp_path / "moved-shards")
    kept = _build_from(tmp_path, "rollouts", "--out", "moved-shards", *GBS)
    assert "step 1: up to date, skipped" in kept.stdout, kept.stdout
    (tmp_path / "rollouts").rename(tmp_path / "moved-rollouts")
    rebuilt = _build_from(tmp_path, "moved-rollouts", "--out", "moved-shards", *GBS)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "up to date" not in rebuilt.stdout
    after = contents(tmp_path / "moved-shards" / "step=1")
    assert {k: v for k, v in after.items() if k != "manifest.json"} == {
        k: v for k, v in ranks.items() if k != "manifest.json"
    }

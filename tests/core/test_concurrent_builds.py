"""Builds of one step at once: they hold the step's lock from the freshness check to the
commit, so the last one published read the newest inputs, and a slow build of older inputs
never replaces a newer step (no lost update), from the CLI or a Dagster run alike."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from pipeline.io import writer
from pipeline.io.checksums import sha256_of
from pipeline.io.discovery import find_sources
from pipeline.io.load import group_steps
from pipeline.settings import Settings
from pipeline.step import stages
from pipeline.step.build import build_step
from pipeline.step.readers.memory import MemoryReader
from pipeline.step.roots import StepRoots
from tests.support.samples import sample, write_step

SETTINGS = Settings(global_batch_size=2)


def _rows(reward: float) -> list[dict[str, Any]]:
    return [sample(i, reward=reward * (i % 2)) for i in range(4)]


def _sources(root: Path) -> list[Any]:
    return group_steps(find_sources([root]))[1]


def _files(folder: Path) -> dict[str, bytes]:
    """The rank files' bytes (the manifest names the input paths, which differ here)."""
    return {p.name: p.read_bytes() for p in sorted(folder.glob("rank=*.parquet"))}


def _clean_build(rows: list[dict[str, Any]], tmp_path: Path) -> dict[str, bytes]:
    write_step(tmp_path / "clean-in", rows)
    build_step(1, _sources(tmp_path / "clean-in"), SETTINGS, tmp_path / "clean-out")
    return _files(tmp_path / "clean-out" / "step=1")


@pytest.mark.parametrize("second", ["cli", "dagster"])
def test_a_slow_build_of_older_inputs_does_not_replace_a_newer_step(
    rows_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, second: str
) -> None:
    """Build A reads the old inputs; while it plans, the producer rewrites the step and
    build B (the CLI's or a Dagster run's) starts. B waits for A, then finds A's step stale
    and publishes the new inputs: what is left equals a clean build of the new inputs."""
    write_step(rows_dir, _rows(1.0))
    out = tmp_path / "shards"
    sources = _sources(rows_dir)
    real_read = MemoryReader.read
    others: list[threading.Thread] = []
    errors: list[BaseException] = []

    def run_b() -> None:
        try:
            if second == "cli":
                build_step(1, sources, SETTINGS, out)
            else:
                list(stages.run_stages(stages.STAGES, StepRoots(rows_dir, out), 1, SETTINGS))
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    def load_then_rewrite(*args: Any) -> Any:
        loaded = real_read(*args)
        if not others:  # build A, once its inputs are read
            write_step(rows_dir, _rows(5.0))
            others.append(threading.Thread(target=run_b))
            others[0].start()
        return loaded

    monkeypatch.setattr(MemoryReader, "read", load_then_rewrite)
    build_step(1, sources, SETTINGS, out)  # build A
    others[0].join(120)

    assert not others[0].is_alive() and errors == []
    assert _files(out / "step=1") == _clean_build(_rows(5.0), tmp_path)
    manifest = json.loads((out / "step=1" / "manifest.json").read_text())
    assert [i["sha256"] for i in manifest["inputs"]] == [sha256_of(s.path) for s in sources]


def test_a_build_waits_for_the_step_lock(rows_dir: Path, tmp_path: Path) -> None:
    write_step(rows_dir, _rows(1.0))
    out = tmp_path / "shards"
    done = threading.Event()
    with writer.step_lock(out, 1):
        builder = threading.Thread(
            target=lambda: (build_step(1, _sources(rows_dir), SETTINGS, out), done.set())
        )
        builder.start()
        assert not done.wait(1.0)
        assert not (out / "step=1").exists()
    builder.join(120)
    assert done.is_set() and (out / "step=1" / "manifest.json").is_file()

"""What the blocking shard checks find in a committed step folder (`step.verify`), the rank
files hashed on the sealing threads or on one."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from pipeline import speed
from pipeline.io.discovery import find_sources
from pipeline.io.load import group_steps
from pipeline.settings import Settings
from pipeline.step import verify
from pipeline.step.build import build_step
from tests.support.samples import generated_step


@pytest.mark.parametrize("off", ["", "write_threads"])
def test_a_changed_and_a_missing_rank_file_are_found_however_many_threads_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, off: str
) -> None:
    monkeypatch.setenv(speed.OFF_ENV, off)
    assert speed.write_threads()[1] == (0 if off else 2)
    inputs = generated_step(tmp_path / "in", samples=600)
    (step, files), *_ = group_steps(find_sources([inputs])).items()
    root = tmp_path / "out"
    manifest = build_step(step, files, Settings(global_batch_size=64, dp_size=4), root)
    folder = root / "step=0"
    names = verify.rank_files(manifest)
    digests = verify.sha256_of_files(folder, names)
    assert digests == {
        name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in names
    }
    assert digests == {output.path: output.sha256 for output in manifest.rank_outputs()}
    assert verify.rank_file_problems(manifest, folder) == []

    changed = bytearray((folder / "rank=1.parquet").read_bytes())
    changed[100] ^= 0xFF  # a page's byte: the footer still reads
    (folder / "rank=1.parquet").write_bytes(bytes(changed))
    (folder / "rank=2.parquet").unlink()
    assert verify.rank_file_problems(manifest, folder) == [
        ("rank=1.parquet", "sha256 differs from the manifest"),
        ("rank=2.parquet", "missing"),
    ]
    # the writer's own read-back skips the hash it computed: the footer still reads
    assert verify.rank_file_problems(manifest, folder, hash_files=False) == [
        ("rank=2.parquet", "missing"),
    ]

"""`rollout-shards build` hashes its input files while the program loads (`HeadStart`);
the read takes such a digest only for the file as it was hashed."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from concurrent.futures import Future, InvalidStateError
from contextlib import suppress
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.io import discovery
from pipeline.io.discovery import SourceFile
from pipeline.io.load import read_file, read_in_parts
from pipeline.speed import TABLE_SUFFIXES, HeadStart, Identity
from tests.support.samples import sample, write_step


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _taken(head_start: HeadStart, path: Path) -> tuple[Identity, str] | None:
    """The digest of `path` once the head start has been through the inputs."""
    head_start._thread.join(timeout=30)
    digest = head_start.digest(path)
    assert digest is not None, path
    return digest.result(timeout=30)


def test_the_suffixes_are_the_readers() -> None:
    assert TABLE_SUFFIXES == tuple(discovery.TABLE_SUFFIXES)


def test_it_hashes_the_table_files_under_the_inputs(tmp_path: Path) -> None:
    first = write_step(tmp_path / "in", [sample(0)], step=1)
    second = write_step(tmp_path / "in" / "step=2", [sample(1)], step=2, fmt="jsonl")
    (tmp_path / "in" / "_temporary").mkdir()
    hidden = write_step(tmp_path / "in" / "_temporary", [sample(2)], step=3)
    os.mkfifo(tmp_path / "in" / "step=4.parquet")  # never opened for reading: no writer

    head_start = HeadStart([str(tmp_path / "in")])
    fifo = _taken(head_start, tmp_path / "in" / "step=4.parquet")
    for path in (first, second):
        taken = _taken(head_start, path)
        assert taken is not None and taken[1] == _sha256(path)
        assert taken[0][1] == path.stat().st_size
    assert fifo is None
    assert head_start.digest(hidden) is None


def test_it_begins_no_file_once_the_program_has_loaded(tmp_path: Path) -> None:
    path = write_step(tmp_path / "in", [sample(0)])
    head_start = HeadStart([])  # nothing to hash yet
    head_start.loaded()
    head_start._hash_files([str(tmp_path / "in")])
    assert head_start.digest(path) is None


def test_the_read_takes_the_digest_only_of_the_file_as_it_was_hashed(tmp_path: Path) -> None:
    path = write_step(tmp_path / "in", [sample(0), sample(1)])
    head_start = HeadStart([str(path)])
    taken = _taken(head_start, path)
    assert taken is not None
    early: Future[tuple[Identity, str] | None] = Future()
    early.set_result((taken[0], "0" * 64))  # a digest the read cannot have computed
    assert read_file(path, 1, early).sha256 == "0" * 64

    write_step(tmp_path / "in", [sample(0), sample(2)])  # the file changed since
    changed: Future[tuple[Identity, str] | None] = Future()
    changed.set_result(taken)
    assert read_file(path, 1, changed).sha256 == _sha256(path) != taken[1]
    gone: Future[tuple[Identity, str] | None] = Future()
    gone.set_result(None)
    assert read_file(path, 1, gone).sha256 == _sha256(path)


def test_a_read_in_parts_decodes_while_the_early_digest_is_still_taken(tmp_path: Path) -> None:
    path = write_step(tmp_path / "in", [sample(i) for i in range(4)])
    head_start = HeadStart([str(path)])
    taken = _taken(head_start, path)
    assert taken is not None
    early: Future[tuple[Identity, str] | None] = Future()
    parts = []

    def take(frame: object, first: int) -> None:
        # the digest is done only once the read has handed rows on
        parts.append(first)
        with suppress(InvalidStateError):
            early.set_result((taken[0], "0" * 64))

    def give_up() -> None:  # a read that waited first gets no digest, and hashes the file
        with suppress(InvalidStateError):
            early.set_result(None)

    timer = threading.Timer(10, give_up)
    timer.start()
    try:
        assert read_in_parts(SourceFile(path, 1), 1, 1 << 20, take, early) == "0" * 64
    finally:
        timer.cancel()
    assert parts == [0]

    other: Future[tuple[Identity, str] | None] = Future()
    other.set_result(((0, 0, 0, 0), "0" * 64))  # a digest of another file's bytes
    hashed = read_in_parts(SourceFile(path, 1), 1, 1 << 20, lambda *_: None, other)
    assert hashed == _sha256(path)


def test_a_build_records_the_sha256_of_its_inputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_step(tmp_path / "in", [sample(i, reward=float(i % 2)) for i in range(4)])
    out = tmp_path / "out"
    assert main(["build", str(tmp_path / "in"), "--out", str(out), "--global-batch-size", "2"]) == 0
    manifest = json.loads((out / "step=1" / "manifest.json").read_text())
    assert [entry["sha256"] for entry in manifest["inputs"]] == [_sha256(path)]
    capsys.readouterr()

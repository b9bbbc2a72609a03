"""Input checksums: the digest itself, the head start the program gives a build, and the
light command line that makes the head start possible."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pipeline.io import checksums
from tests.conftest import REPO


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_file_digest_is_the_sha256_of_its_bytes(tmp_path: Path, monkeypatch: Any) -> None:
    """Every way of hashing gives the bytes' sha256: buffered reads, and the head start's
    chunks, mapped (while the program imports) or read into a buffer (after)."""
    full, empty = tmp_path / "a.parquet", tmp_path / "b.parquet"
    full.write_bytes(os.urandom((3 << 20) + 12345))
    empty.write_bytes(b"")
    monkeypatch.setattr(checksums, "CHUNK", 1 << 20)
    monkeypatch.setattr(checksums, "BUFFER", 300_000)
    monkeypatch.setattr(checksums, "imported", threading.Event())

    for imported in (False, True):
        if imported:
            checksums.imported.set()
        for hashed in (checksums._hash, checksums._hash_mapped, checksums.sha256_of):
            assert hashed(full) == _digest(full.read_bytes())
            assert hashed(empty) == _digest(b"")


def test_an_early_digest_serves_once_and_only_while_the_file_is_unchanged(
    tmp_path: Path, monkeypatch: Any
) -> None:
    kept, changed = tmp_path / "kept.parquet", tmp_path / "changed.parquet"
    kept.write_bytes(b"kept")
    changed.write_bytes(b"before")
    calls: list[str] = []

    def counted(kind: str) -> Any:
        real = getattr(checksums, kind)

        def hash_and_count(path: Path) -> str:
            calls.append(f"{kind} {path.name}")
            return real(path)

        return hash_and_count

    for kind in ("_hash", "_hash_mapped"):
        monkeypatch.setattr(checksums, kind, counted(kind))
    checksums.begin([kept, changed]).join(10)
    changed.write_bytes(b"after, longer")

    assert checksums.sha256_of(kept) == _digest(b"kept")
    assert checksums.sha256_of(changed) == _digest(b"after, longer")
    # kept: hashed once, early; changed: early (now stale) and again when asked for
    early = ["_hash_mapped kept.parquet", "_hash_mapped changed.parquet"]
    assert calls == [*early, "_hash changed.parquet"]
    # an early digest serves one caller: the next one hashes the file again
    assert checksums.sha256_of(kept) == _digest(b"kept")
    assert calls[-1] == "_hash kept.parquet"
    assert checksums._early == {}


def test_a_digest_asked_for_before_its_turn_is_hashed_by_the_caller(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The head start hashes one file at a time: a step whose file it has not reached
    hashes that file itself rather than waiting, and the head start then skips it."""
    first, second = tmp_path / "first.parquet", tmp_path / "second.parquet"
    first.write_bytes(b"first")
    second.write_bytes(b"second")
    release, started = threading.Event(), threading.Event()
    early: list[str] = []
    real = checksums._hash_mapped

    def slow_first(path: Path) -> str:
        early.append(path.name)
        if path == first:
            started.set()
            assert release.wait(10)
        return real(path)

    monkeypatch.setattr(checksums, "_hash_mapped", slow_first)
    walker = checksums.begin([tmp_path])
    assert started.wait(10)

    assert checksums.sha256_of(second) == _digest(b"second")
    release.set()
    walker.join(10)
    assert early == ["first.parquet"]
    assert checksums.sha256_of(first) == _digest(b"first")
    assert checksums._early == {} and checksums._claimed == set()


def test_the_table_files_under_the_inputs_in_a_stable_order(tmp_path: Path) -> None:
    (tmp_path / "run" / "b").mkdir(parents=True)
    (tmp_path / "run" / ".hidden").mkdir()
    for name in ("run/step=2.parquet", "run/step=1.jsonl", "run/b/x.arrow", "run/b/d.pt"):
        (tmp_path / name).write_text("x")
    for name in ("run/notes.txt", "run/.tmp.parquet", "run/.hidden/step=3.parquet"):
        (tmp_path / name).write_text("x")
    single = tmp_path / "one.feather"
    single.write_text("x")

    found = list(checksums.table_files([tmp_path / "run", single, tmp_path / "absent"]))

    assert [p.relative_to(tmp_path).as_posix() for p in found] == [
        "run/step=1.jsonl",
        "run/step=2.parquet",
        "run/b/d.pt",
        "run/b/x.arrow",
        "one.feather",
    ]


def test_the_command_line_loads_no_polars_before_the_command_runs() -> None:
    """Parsing the arguments (and a usage error) needs neither Polars nor the stages: the
    program's head start on hashing runs while they load."""
    script = "import sys, pipeline.cli; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", "import json; " + script],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    loaded = set(json.loads(result.stdout))
    assert not {"polars", "numpy", "pyarrow", "pipeline.commands"} & loaded


def test_the_program_records_the_sha256_of_each_input(tmp_path: Path) -> None:
    """`rollout-shards build` as a program (the head start on): the manifest's input
    checksums are those of the files' bytes."""
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "build", "data/rollouts", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    manifests = sorted(out.glob("step=*/manifest.json"))
    assert manifests
    for manifest in manifests:
        for record in json.loads(manifest.read_text())["inputs"]:
            path = Path(record["path"])
            path = path if path.is_absolute() else REPO / path
            assert record["sha256"] == _digest(path.read_bytes())


def test_the_head_start_waits_while_a_read_holds_it(tmp_path: Path, monkeypatch: Any) -> None:
    """`paused` holds early digests between chunks (a build's read wants both cores); they
    finish once the read is done, with the file's sha256."""
    data = os.urandom(16 * 4096)
    path = tmp_path / "step=1.parquet"
    path.write_bytes(data)
    monkeypatch.setattr(checksums, "CHUNK", 4096)

    with checksums.paused():
        walker = checksums.begin([path])
        deadline = time.monotonic() + 10
        while str(path) not in checksums._early and time.monotonic() < deadline:
            time.sleep(0.01)
        _, future = checksums._early[str(path)]
        with checksums.paused():  # reads may overlap: the last one to end resumes
            pass
        time.sleep(0.3)
        assert not future.done()

    assert future.result(timeout=10) == _digest(data)
    walker.join(10)
    assert checksums.sha256_of(path) == _digest(data)


def test_the_head_start_leaves_a_fifo_alone(tmp_path: Path) -> None:
    """A FIFO named like a table (the readers skip it) would block the thread opening it:
    the head start passes over it to the files after it."""
    os.mkfifo(tmp_path / "a.parquet")
    (tmp_path / "b.parquet").write_bytes(b"b")

    checksums.begin([tmp_path]).join(10)

    assert list(checksums._early) == [str(tmp_path / "b.parquet")]
    assert checksums.sha256_of(tmp_path / "b.parquet") == _digest(b"b")

"""Input checksums: the digest of a file, and the manifest's record of each input vouching
for exactly the bytes the build read."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from pipeline.errors import StepError
from pipeline.io import load
from pipeline.io.checksums import input_digest, sha256_of
from pipeline.io.discovery import SourceFile
from tests.support.samples import REPO, sample, table


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_file_digest_is_the_sha256_of_its_bytes(tmp_path: Path) -> None:
    full, empty = tmp_path / "a.parquet", tmp_path / "b.parquet"
    full.write_bytes(os.urandom((3 << 20) + 12345))
    empty.write_bytes(b"")
    assert sha256_of(full) == _digest(full.read_bytes())
    assert sha256_of(empty) == _digest(b"")


def test_an_unreadable_input_has_no_digest_but_a_reason(tmp_path: Path) -> None:
    link = tmp_path / "step=1.parquet"
    link.symlink_to(tmp_path / "gone.parquet")
    assert input_digest(link) == "unreadable: No such file or directory"


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_a_table_that_changes_while_it_is_read_fails_its_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A writer rewriting the file while the reader parses it: the digest could vouch for
    other bytes than the rows, so the step fails with one line and the rebuild reads the
    new file whole."""
    suffix = {"parquet": ".parquet", "jsonl": ".jsonl"}[kind]
    path = tmp_path / f"step=1{suffix}"
    write = {
        "parquet": lambda rows: table(rows).write_parquet(path),
        "jsonl": lambda rows: table(rows).write_ndjson(path),
    }[kind]
    write([sample(0)])
    real = load.READERS[kind]

    def rewritten_meanwhile(source: Any, mapper: Any) -> pl.DataFrame:
        write([sample(5), sample(6)])
        return real(source, mapper)

    monkeypatch.setitem(load.READERS, kind, rewritten_meanwhile)
    with pytest.raises(StepError) as error:
        load.load_step(1, [SourceFile(path, 1)])
    (violation,) = error.value.violations
    assert violation.rule == "unreadable_file"
    assert violation.message.endswith("the file changed while it was read: build again")

    monkeypatch.setitem(load.READERS, kind, real)
    loaded = load.load_step(1, [SourceFile(path, 1)])
    assert loaded.frame.get_column("index").to_list() == [5, 6]
    assert loaded.files == [{"path": str(path), "sha256": sha256_of(path), "rows": 2}]


def test_a_dump_that_changes_while_it_is_read_fails_its_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "rollout_data" / "1.pt"
    path.parent.mkdir()
    path.write_bytes(b"first bytes")

    def read_then_changed(fmt: Any, dump: Path, step: int | None, **options: Any) -> pl.DataFrame:
        assert fmt.name == "miles"
        dump.write_bytes(b"other bytes, longer")
        return table([sample(0)])

    # the one dump frame every format is read through (pipeline.io.formats)
    monkeypatch.setattr(load, "read_dump", read_then_changed)
    with pytest.raises(StepError) as error:
        load.load_step(1, [SourceFile(path, 1, "miles")])
    (violation,) = error.value.violations
    assert violation.rule == "unreadable_file"
    assert violation.message == "the file changed while it was read: build again"


def test_the_command_line_loads_no_polars_before_the_command_runs() -> None:
    """Parsing the arguments (and a usage error) needs neither Polars nor the stages."""
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
    """`rollout-shards build` as a program: the manifest's input checksums are those of
    the files' bytes."""
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

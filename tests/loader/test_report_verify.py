"""The loader reads a step with its report (`report.html`, among the manifest's outputs),
and refuses a manifest whose report record was changed after the build."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rollout_shards_loader import ShardVerificationError, read_manifest, read_rank

from pipeline.report import REPORT
from tests.support.report_step import SETTINGS, worked_step
from tests.support.samples import build


def test_the_loader_reads_a_step_with_its_report_manifest(tmp_path: Path) -> None:
    build(worked_step(tmp_path / "in"), tmp_path / "out", **SETTINGS)
    folder = tmp_path / "out" / "step=5"
    manifest = read_manifest(folder)
    assert manifest["report"] == REPORT
    assert REPORT in {o["path"] for o in manifest["outputs"]}
    assert sum(len(read_rank(folder, rank)["tokens"]) for rank in range(2)) == 12


def test_a_report_record_edited_after_the_build_is_refused(tmp_path: Path) -> None:
    build(worked_step(tmp_path / "in"), tmp_path / "out", **SETTINGS)
    folder = tmp_path / "out" / "step=5"
    manifest = read_manifest(folder)  # its seal kept: the edit is after the build
    manifest["report"] = None
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardVerificationError):
        read_rank(folder, 0)

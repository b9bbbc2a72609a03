"""`rollout-shards build` is ingest, plan, write in order: a step that breaks a rule fails
at validation, before any plan, with the line `validate` gives for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline import commands
from pipeline.cli import main
from pipeline.progress import Progress
from pipeline.step import build
from tests.support.samples import only_refused, sample, write_step

ARGS = ["--global-batch-size", "2"]


def _build(capsys: pytest.CaptureFixture[str], rows: Path, out: Path) -> tuple[int, str, str]:
    code = main(["build", str(rows), "--out", str(out), *ARGS])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_broken_rule_fails_the_step_before_it_is_planned(
    rows_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # unique_leaf; a group_index per prompt, so quarantine (the hint) could build the rest
    rows = [
        sample(0, group_index=0),
        sample(0, group_index=0),
        *(sample(i, group_index=i) for i in (1, 2)),
    ]
    path = write_step(rows_dir, rows)
    planned: list[int] = []
    real = build.plan_batch
    monkeypatch.setattr(build, "plan_batch", lambda *a: planned.append(1) or real(*a))
    out = tmp_path / "shards"

    code, stdout, err = _build(capsys, rows_dir, out)

    assert code == 1
    assert err == (
        f"rollout-shards: build: step 1: {path}: rule unique_leaf: (step, index, leaf) must "
        "be unique; first at file row 1; --on-invalid quarantine would set these trajectories "
        "aside and build the rest; rows (index, leaf): (0, 0), (0, 0)\n"
    )
    assert stdout == ""  # no stage was done: validation failed
    assert planned == []
    assert only_refused(out, 1)


def test_the_same_step_validated_gives_the_same_line(
    rows_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_step(rows_dir, [sample(0), sample(0), sample(1), sample(2)])
    code, _, built = _build(capsys, rows_dir, tmp_path / "shards")
    assert main(["validate", str(rows_dir), *ARGS]) == 1
    validated = capsys.readouterr().err
    assert code == 1
    assert built == validated.replace("rollout-shards: validate: ", "rollout-shards: build: ")


def test_a_valid_step_reports_each_stage_in_order(
    rows_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stages: list[tuple[int, str]] = []

    class Recorded(Progress):
        def end(self, step: int, stage: str, detail: str) -> None:
            stages.append((step, stage))

    monkeypatch.setattr(commands, "Progress", Recorded)
    write_step(rows_dir, [sample(i, reward=float(i % 2)) for i in range(4)])
    code, stdout, _ = _build(capsys, rows_dir, tmp_path / "shards")
    assert code == 0
    assert stages == [(1, "read and validate"), (1, "plan"), (1, "write")]
    assert stdout.startswith("step 1: 4 rows in, ")  # the summary alone: no stage lines
    assert stdout.count("\n") == 1
    assert (tmp_path / "shards" / "step=1" / "manifest.json").is_file()

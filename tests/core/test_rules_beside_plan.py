"""`rollout-shards build` checks a step's row and cross-row rules on a thread while it plans
the step (`pipeline.step.build`): what a user sees must be what a build that validated
first would show."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from pipeline.cli import main
from pipeline.step import plan as plan_module
from tests.conftest import sample, write_step

ARGS = ["--global-batch-size", "2"]


def _build(capsys: pytest.CaptureFixture[str], rows: Path, out: Path) -> tuple[int, str, str]:
    code = main(["build", str(rows), "--out", str(out), *ARGS])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_broken_rule_fails_the_step_whatever_its_plan_did(
    rows_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    # a repeated (index, leaf): unique_leaf, one of the rules checked beside the plan
    path = write_step(rows_dir, [sample(0), sample(0), sample(1), sample(2)])

    def plan_that_falls_over(*_: object, **__: object) -> None:
        warnings.warn("the plan saw a repeated leaf", stacklevel=1)
        raise RuntimeError("the plan fell over")

    monkeypatch.setattr(plan_module, "plan_batch", plan_that_falls_over)
    out = tmp_path / "shards"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, stdout, err = _build(capsys, rows_dir, out)

    assert code == 1
    assert err == (
        f"rollout-shards: build: step 1: {path}: rule unique_leaf: (step, index, leaf) must "
        "be unique; rows (index, leaf): (0, 0), (0, 0)\n"
    )
    assert stdout == ""  # no stage was done: validation failed
    assert not [w for w in caught if "repeated leaf" in str(w.message)]
    assert not out.exists()


def test_the_same_step_validated_first_gives_the_same_line(
    rows_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_step(rows_dir, [sample(0), sample(0), sample(1), sample(2)])
    code, _, built = _build(capsys, rows_dir, tmp_path / "shards")
    assert main(["validate", str(rows_dir), *ARGS]) == 1
    validated = capsys.readouterr().err
    assert code == 1
    assert built == validated.replace("rollout-shards: validate: ", "rollout-shards: build: ")


def test_a_valid_steps_plan_warnings_are_shown_once_its_rules_pass(
    rows_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    write_step(rows_dir, [sample(i, reward=float(i % 2)) for i in range(4)])
    real = plan_module.plan_batch

    def plan_with_a_note(*args: Any, **kwargs: Any) -> Any:
        warnings.warn("a note from the plan", stacklevel=1)
        return real(*args, **kwargs)

    monkeypatch.setattr(plan_module, "plan_batch", plan_with_a_note)
    with pytest.warns(UserWarning, match="a note from the plan"):
        code, stdout, _ = _build(capsys, rows_dir, tmp_path / "shards")
    assert code == 0
    assert "step 1: read and validate: 4 rows read (" in stdout
    assert (tmp_path / "shards" / "step=1" / "manifest.json").is_file()

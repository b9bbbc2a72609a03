"""A refused step leaves its record in the output root (`_refused/step=<N>.json`): the rules
and rows, the inputs with their sha256, the settings and when; the next build that commits
the step (or finds it current) removes it; the root read as a dataset ignores it;
`validate <output root>` and `metrics` show it."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import polars as pl
import pyarrow.dataset as ds
import pytest

from pipeline.errors import StepError
from pipeline.schemas.validate import QUARANTINE_HINT
from pipeline.step.refused import record_path
from tests.support.cli import cli
from tests.support.samples import REPO, build, sample, write_step

# the refusal's line as the user reads it: the offending value, its file row and the hint
RULE_LINE = (
    "rule reward_finite: reward must be a finite number on every row; file row 3 has reward "
    f"NaN; {QUARANTINE_HINT}; rows (index, leaf)"
)


def _rows(bad: bool) -> list[dict]:
    # prompts of two samples, so quarantine (the hint) could set the bad row's prompt aside
    return [
        sample(i, reward=float("nan") if bad and i == 2 else float(i % 2), group_index=i // 2)
        for i in range(8)
    ]


def _refuse(tmp_path: Path, step: int = 3) -> tuple[Path, Path]:
    """Step `step` built from rows one of which has a NaN reward: refused."""
    source = write_step(tmp_path / "in", _rows(bad=True), step=step)
    with pytest.raises(StepError):
        build(tmp_path / "in", tmp_path / "out", global_batch_size=4, dp_size=2)
    return source, tmp_path / "out"


def test_a_refused_step_leaves_its_record_and_nothing_else(tmp_path: Path) -> None:
    source, out = _refuse(tmp_path)
    path = record_path(out, 3)
    assert path == out / "_refused" / "step=3.json"
    record = json.loads(path.read_text())
    assert record["step"] == 3
    assert record["lines"] == [f"step 3: {source}: {RULE_LINE}: (2, 0)"]
    (violation,) = record["violations"]
    assert violation["rule"] == "reward_finite"
    assert (violation["rows"], violation["n_rows"]) == ([[2, 0]], 1)
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    assert record["inputs"] == [{"path": str(source.resolve()), "sha256": digest}]
    assert record["settings"]["global_batch_size"] == 4 and record["settings"]["dp_size"] == 2
    assert record["refused_at"].endswith("+00:00")
    assert record["shown_by"] == f"rollout-shards validate {out.resolve()}"
    # nothing of the step, and no temporary file beside the record
    assert not (out / "step=3").exists() and not (out / "_quarantine").exists()
    assert sorted(p.name for p in (out / "_refused").iterdir()) == ["step=3.json"]


def test_the_next_build_that_commits_the_step_removes_it(tmp_path: Path) -> None:
    _, out = _refuse(tmp_path)
    write_step(tmp_path / "in", _rows(bad=False), step=3)
    build(tmp_path / "in", out, global_batch_size=4, dp_size=2)
    assert (out / "step=3" / "manifest.json").is_file()
    assert not record_path(out, 3).exists()
    # refused again, then the good input back: the build finds the step current and the
    # record goes too (what stands is that input's build)
    write_step(tmp_path / "in", _rows(bad=True), step=3)
    with pytest.raises(StepError):
        build(tmp_path / "in", out, global_batch_size=4, dp_size=2)
    assert record_path(out, 3).is_file()
    write_step(tmp_path / "in", _rows(bad=False), step=3)
    build(tmp_path / "in", out, global_batch_size=4, dp_size=2)
    assert not record_path(out, 3).exists()


def test_the_root_read_as_a_dataset_ignores_refused_records(tmp_path: Path) -> None:
    """A committed step beside a refused one: pyarrow's dataset, a Polars glob and Hugging
    Face datasets read the committed rows only."""
    import datasets

    write_step(tmp_path / "good", _rows(bad=False), step=1)
    out = tmp_path / "out"
    build(tmp_path / "good", out, global_batch_size=4, dp_size=2)
    write_step(tmp_path / "in", _rows(bad=True), step=3)
    with pytest.raises(StepError):
        build(tmp_path / "in", out, global_batch_size=4, dp_size=2)
    assert record_path(out, 3).is_file()
    dataset = ds.dataset(out, format="parquet", exclude_invalid_files=True)
    assert not [f for f in dataset.files if "_refused" in f]
    table = dataset.to_table()
    assert table.num_rows == 8 and set(table.column("step").to_pylist()) == {1}
    assert pl.scan_parquet(out / "step=*" / "rank=*.parquet").collect().height == 8
    loaded = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "hf"))
    assert loaded["train"].num_rows == 8


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return cli(*args, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)


def test_validate_and_metrics_of_the_output_root_show_refused_steps(tmp_path: Path) -> None:
    write_step(tmp_path / "good", _rows(bad=False), step=1)
    out = tmp_path / "out"
    build(tmp_path / "good", out, global_batch_size=4, dp_size=2)
    source, _ = _refuse(tmp_path)
    shown = _cli("validate", out)
    assert shown.returncode == 1
    assert shown.stderr == f"rollout-shards: validate: step 3: {source}: {RULE_LINE}: (2, 0)\n"
    when = json.loads(record_path(out, 3).read_text())["refused_at"]
    assert shown.stdout == (
        f"step 1: built -> {out / 'step=1'}\n"
        f"step 3: refused by its build at {when}: {record_path(out, 3)} holds its rules, "
        "rows, inputs and settings\n"
    )
    metrics = _cli("metrics", out, "--jsonl", "-")
    assert metrics.returncode == 0
    assert [json.loads(line)["rollout/step"] for line in metrics.stdout.splitlines()] == [1.0]
    assert metrics.stderr == (
        f"rollout-shards: metrics: note: step 3 was refused by its build (step 3: {source}: "
        f"{RULE_LINE}: (2, 0)): `rollout-shards validate {out}` shows it all\n"
    )
    # with no refused step left, validate of the root says so and succeeds
    record_path(out, 3).unlink()
    assert _cli("validate", out).returncode == 0

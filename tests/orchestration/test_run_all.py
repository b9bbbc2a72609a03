"""`make run`: every step under the input root registered and materialized through Dagster."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
from dagster_support import EMBEDDED_KEYS, Roots, break_step_1, configured_roots

from pipeline.orchestration import run_all
from pipeline.orchestration.partitions import rollout_steps


@pytest.fixture
def roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Roots:
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    (tmp_path / "dagster_home").mkdir()
    return configured_roots(tmp_path, monkeypatch)


def test_run_all_builds_every_step(roots: Roots, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_all.main() == 0

    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out[:4]] == ["step 1", "step 2", "step 3", "step 4"]
    assert f"-> {roots.output / 'step=3'}" in out[2]
    assert out[-1].startswith(f"shards of 4 of 4 steps under {roots.output}/")
    for step in (1, 2, 3, 4):
        assert (roots.output / f"step={step}" / "manifest.json").is_file()
    instance = dg.DagsterInstance.get()
    assert instance.get_dynamic_partitions(rollout_steps.name) == EMBEDDED_KEYS


def test_run_all_reports_an_invalid_step_and_builds_the_rest(
    roots: Roots, capsys: pytest.CaptureFixture[str]
) -> None:
    break_step_1(roots)

    assert run_all.main() == 1

    captured = capsys.readouterr()
    assert "step 1: rollout_samples: step 1:" in captured.err
    assert "rule response_within_tokens" in captured.err
    assert "shards of 3 of 4 steps" in captured.out
    assert not (roots.output / "step=1").exists()

"""`make run`: every step under the input root registered and materialized through Dagster."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from pipeline.orchestration import run_all
from pipeline.orchestration.partitions import rollout_steps
from tests.support.dagster_roots import (
    EMBEDDED_KEYS,
    Roots,
    break_step_1,
    configured_roots,
    makefile_instance,
)


@pytest.fixture
def roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Roots:
    # As `make run` has it (the Makefile's dagster.yaml): else Dagster greets on stderr.
    monkeypatch.setenv("DAGSTER_HOME", str(makefile_instance(tmp_path / "dagster_home")))
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


def test_started_with_sigint_ignored_sigterm_still_stops_it(roots: Roots) -> None:
    """A script's `make run &` starts it with SIGINT ignored; Dagster's run points SIGTERM
    at SIGINT's handler. After the runs, SIGTERM still stops this process and its children."""
    sigterm = signal.getsignal(signal.SIGTERM)
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert run_all.main() == 0
        assert signal.getsignal(signal.SIGTERM) is sigterm
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        try:
            child.terminate()
            assert child.wait(timeout=60) == -signal.SIGTERM
        finally:
            child.kill()
            child.wait()
    finally:
        signal.signal(signal.SIGINT, before)


def test_run_all_reports_an_invalid_step_and_builds_the_rest(
    roots: Roots, capsys: pytest.CaptureFixture[str]
) -> None:
    break_step_1(roots)

    assert run_all.main() == 1

    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if ": warning: " not in line]
    *rules, logs = errors
    assert all(line.startswith("rollout-shards: build: step 1: ") for line in rules)
    assert any("rule response_within_tokens" in line for line in rules)
    assert logs.startswith("rollout-shards: step 1: logs: run ")
    # the `make ui` that serves this run's Dagster home: the same two roots
    assert logs.endswith(f"(`make ui INPUT={roots.input} OUTPUT={roots.output}`, Runs)")
    assert "shards of 3 of 4 steps" in captured.out
    assert not (roots.output / "step=1").exists()


def test_run_all_without_settings_starts_with_the_cause(
    roots: Roots, capsys: pytest.CaptureFixture[str]
) -> None:
    """Finding the steps needs the settings (`require_success_marker`): without any, the
    run stops before any step with the cause, as one usage line."""
    (roots.input / "rollout-shards.yaml").unlink()

    assert run_all.main() == 2

    captured = capsys.readouterr()
    assert captured.err == (
        "rollout-shards: usage error: invalid settings: global_batch_size: required by the "
        "miles trainer (miles' --global-batch-size): give --global-batch-size, or "
        "global_batch_size in --config or in the input root's rollout-shards.yaml\n"
    )
    assert "shards of" not in captured.out
    assert not roots.output.exists() or not list(roots.output.glob("step=*"))


def test_a_second_run_skips_current_steps_and_force_rebuilds_them(
    roots: Roots, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run_all.main() == 0
    capsys.readouterr()
    manifest = roots.output / "step=2" / "manifest.json"
    written = manifest.stat().st_mtime_ns

    assert run_all.main() == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(": ")[1] for line in out[:4]] == ["up to date, skipped"] * 4
    assert manifest.stat().st_mtime_ns == written

    monkeypatch.setenv(run_all.FORCE_ENV, "1")
    assert run_all.main() == 0
    out = capsys.readouterr().out.splitlines()
    assert all(" rows in, " in line for line in out[:4])
    assert manifest.stat().st_mtime_ns != written


def test_the_makefile_instance_shows_no_onboarding_prompt(roots: Roots) -> None:
    """`make ui` opens on the project, not on Dagster's community sign-up modal (`nux`)."""
    instance = dg.DagsterInstance.get()
    assert not instance.is_ephemeral
    assert instance.nux_enabled is False
    assert instance.get_settings("telemetry") == {"enabled": False}


def test_runs_are_tagged_with_their_roots(roots: Roots) -> None:
    assert run_all.main() == 0
    runs = dg.DagsterInstance.get().get_runs()
    assert len(runs) == 4
    for run in runs:
        assert run.tags[run_all.INPUT_ROOT_TAG] == str(roots.input.resolve())
        assert run.tags[run_all.OUTPUT_ROOT_TAG] == str(roots.output.resolve())

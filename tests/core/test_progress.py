"""Progress: a bar redrawn in place on stderr when it is a terminal, nothing otherwise or
with --quiet; stdout holds the summary lines alone."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.progress import Progress
from tests.support.samples import REPO


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bar_on_a_terminal_is_redrawn_and_cleared() -> None:
    screen = Terminal()
    progress = Progress(2, ("read and validate", "plan", "write"), stream=screen)
    for step in (1, 2):
        for stage in progress.stages:
            progress.begin(step, stage)
            progress.end(step, stage, "done")
        progress.step_done()
    frames = screen.getvalue().split("\r")
    assert "[------------------------] step 1 (1/2): read and validate" in frames[1]
    assert "[####################----] step 2 (2/2): write" in screen.getvalue()
    assert screen.getvalue().endswith("\r")  # the bar is erased before the next line
    assert "\n" not in screen.getvalue()


def test_nothing_elsewhere_or_when_quiet(capsys: pytest.CaptureFixture[str]) -> None:
    for progress in (
        Progress(1, ("plan",), stream=io.StringIO()),
        Progress(1, ("plan",), stream=Terminal(), quiet=True),
    ):
        progress.begin(7, "plan")
        progress.end(7, "plan", "12 rows to write")
        progress.step_done()
        assert progress.stream.getvalue() == ""  # type: ignore[attr-defined]
    assert capsys.readouterr() == ("", "")


def test_build_on_a_terminal_shows_the_bar(tmp_path: Path) -> None:
    command = f"{sys.executable} -m pipeline.cli build data/rollouts --out {tmp_path / 'out'}"
    log = tmp_path / "typescript"
    subprocess.run(["script", "-qec", command, str(log)], cwd=REPO, check=True, capture_output=True)
    screen = log.read_text()
    assert "] step 3 (3/4): plan" in screen
    assert "step 3: 16 rows in" in screen
    # each stage's bar says what it did; only the summary lines stay on the screen
    assert "] step 1 (1/4): read and validate: " in screen
    raw = log.read_bytes().decode()  # the bar's carriage returns as written
    kept = [line.rstrip("\r").split("\r")[-1].strip() for line in raw.split("\n")[1:-2]]
    summaries = [line for line in kept if line and not line.startswith("rollout-shards: ")]
    assert [line.split(": ")[0] for line in summaries] == [f"step {n}" for n in range(1, 5)]
    quiet = tmp_path / "quiet"
    subprocess.run(
        ["script", "-qec", f"{command} --force --quiet", str(quiet)],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    assert "] step " not in quiet.read_text() and "step 3: 16 rows in" in quiet.read_text()


def test_piped_build_prints_the_summary_lines_alone(tmp_path: Path) -> None:
    out = tmp_path / "out"
    command = [sys.executable, "-m", "pipeline.cli", "build", "data/rollouts", "--out", str(out)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True)
    assert [line.split(": ")[0] for line in result.stdout.splitlines()] == [
        f"step {n}" for n in range(1, 5)
    ]
    assert all(" rows in, " in line for line in result.stdout.splitlines())
    assert "read and validate" not in result.stderr  # only the warnings


def test_build_output_piped_into_head_exits_quietly(tmp_path: Path) -> None:
    command = (
        f"{sys.executable} -m pipeline.cli build data/rollouts --out {tmp_path / 'o'} | head -1"
    )
    result = subprocess.run(["bash", "-c", command], cwd=REPO, capture_output=True, text=True)
    assert result.stdout.startswith("step 1: 16 rows in, ")
    assert "Traceback" not in result.stderr

"""Progress: a bar redrawn in place on a terminal, plain lines otherwise."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.progress import Progress
from tests.conftest import REPO


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


def test_plain_lines_elsewhere(capsys: pytest.CaptureFixture[str]) -> None:
    progress = Progress(1, ("plan",), stream=io.StringIO())
    progress.begin(7, "plan")
    progress.end(7, "plan", "12 rows to write")
    out = capsys.readouterr().out
    assert out.startswith("step 7: plan: 12 rows to write (")
    assert out.endswith(" s)\n")


def test_build_on_a_terminal_shows_the_bar(tmp_path: Path) -> None:
    command = f"{sys.executable} -m pipeline.cli build data/rollouts --out {tmp_path / 'out'}"
    log = tmp_path / "typescript"
    subprocess.run(["script", "-qec", command, str(log)], cwd=REPO, check=True, capture_output=True)
    screen = log.read_text()
    assert "] step 3 (3/4): plan" in screen
    assert "step 3: 16 rows in" in screen
    assert ": read and validate: " not in screen  # no plain lines on a terminal


def test_build_output_piped_into_head_exits_quietly(tmp_path: Path) -> None:
    command = (
        f"{sys.executable} -m pipeline.cli build data/rollouts --out {tmp_path / 'o'} | head -1"
    )
    result = subprocess.run(["bash", "-c", command], cwd=REPO, capture_output=True, text=True)
    assert result.stdout.startswith("step 1: read and validate: ")
    assert "Traceback" not in result.stderr

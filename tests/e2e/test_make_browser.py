"""`make browser` (run by `make test`) on a developer's machine: a Chromium that starts is
used as it is and nothing is installed; otherwise make says what it installs and why
before apt-get installs the one package without recommended ones. apt-get, sudo and
Chromium are stand-ins on PATH here that only record how they were called."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.samples import REPO

RECORDER = """#!/bin/sh
echo "$(basename "$0") $*" >> "{log}"
exit {status}
"""


def _tool(folder: Path, name: str, log: Path, status: int = 0) -> Path:
    path = folder / name
    path.write_text(RECORDER.format(log=log, status=status))
    path.chmod(0o755)
    return path


def _make_browser(tmp_path: Path, chromium: Path, apt: bool = True) -> tuple[int, str, str]:
    """`make -s browser` with the stand-ins first on PATH (and no apt-get when not `apt`)."""
    tools = tmp_path / "bin"
    tools.mkdir(exist_ok=True)
    log = tmp_path / "calls.log"
    if apt:
        _tool(tools, "apt-get", log)
    _tool(tools, "sudo", log)
    # the commands the recipe runs besides them: a shell's, and nothing of apt
    for name in ("sh", "id", "env", "basename"):
        found = shutil.which(name)
        assert found is not None, name
        (tools / name).symlink_to(found)
    make = shutil.which("make")
    assert make is not None, "make is not installed"
    done = subprocess.run(
        [make, "-s", "browser", f"CHROMIUM={chromium}", "SHELL=" + str(tools / "sh")],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PATH": str(tools)},
        check=False,
    )
    calls = log.read_text() if log.exists() else ""
    return done.returncode, done.stdout + done.stderr, calls


def test_a_chromium_that_starts_installs_nothing(tmp_path: Path) -> None:
    log = tmp_path / "chromium.log"
    chromium = _tool(tmp_path, "chromium", log)
    status, output, calls = _make_browser(tmp_path, chromium)
    assert (status, output, calls) == (0, "", "")
    assert log.read_text() == "chromium --version\n"


@pytest.mark.parametrize("present", [False, True], ids=["missing", "broken"])
def test_a_missing_chromium_is_installed_after_saying_what_and_why(
    tmp_path: Path, present: bool
) -> None:
    chromium = tmp_path / "chromium"
    if present:  # there, but it does not start
        _tool(tmp_path, "chromium", tmp_path / "chromium.log", status=127)
    status, output, calls = _make_browser(tmp_path, chromium)
    assert status == 0, output
    lines = output.splitlines()
    assert lines[0] == (
        f"make: the browser test (tests/e2e/test_ui.py) drives Chromium at {chromium}, "
        "which is missing or does not start."
    )
    assert lines[1].startswith(
        "make: installing the system package chromium with apt-get, without recommended packages"
    )
    install = "apt-get install -y -qq --no-install-recommends chromium"
    if os.getuid() == 0:
        assert calls.splitlines() == ["apt-get update -qq", install]
    else:  # the stand-in sudo records its command and runs nothing
        assert calls.splitlines() == [
            "sudo apt-get update -qq",
            f"sudo env DEBIAN_FRONTEND=noninteractive {install}",
        ]


def test_without_apt_it_says_what_to_install_and_stops(tmp_path: Path) -> None:
    status, output, calls = _make_browser(tmp_path, tmp_path / "chromium", apt=False)
    assert status != 0
    assert "install Chromium, or name one with CHROMIUM=/path/to/chromium" in output
    assert calls == ""

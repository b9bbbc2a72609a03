"""Clean virtualenvs for the install tests, as a user's `python -m venv` and `pip install`
make them. The installs go through uv's pip interface (`uv pip install --python VENV`):
the same requirements, the same index and the same rule for what a venv already holds (a
pinned package that satisfies a requirement stays), at a fraction of pip's CPU, which the
test run shares with every other test. `make install` installs uv beside pip."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

# uv runs as a user's installer would: no PYTHONPATH of the test run's (a checkout on it
# would show the project as installed already, and it would skip installing it)
CLEAN_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
UV = Path(sys.executable).with_name("uv")


def bare_venv(folder: Path) -> Path:
    """A new, empty virtualenv at `folder`; its python."""
    venv.EnvBuilder(with_pip=False, clear=True).create(folder)
    return folder / "bin" / "python"


def _uv(*args: str) -> str:
    """`uv ARGS`, without the test run's PYTHONPATH; its stdout."""
    run = subprocess.run(
        [str(UV), *args], check=True, capture_output=True, text=True, env=CLEAN_ENV
    )
    return run.stdout


def pip(python: Path, *args: str) -> str:
    """`uv pip ARGS` against the venv of `python` (`install`, `list`); its stdout."""
    command, *rest = args
    return _uv("pip", command, "--python", str(python), *rest)


def installed(python: Path) -> set[str]:
    """name==version of every package in the venv (`pip list --format=freeze`)."""
    return set(pip(python, "list", "--format=freeze").split())


def wheel(source: Path, into: Path) -> Path:
    """The wheel `pip install SOURCE` would build, built into `into` (`uv build`, in an
    isolated build environment, as pip builds it)."""
    _uv("build", "--quiet", "--wheel", "--out-dir", str(into), str(source))
    (built,) = into.glob("*.whl")
    return built

"""Clean virtualenvs for the install tests, as a user's `python -m venv` and `pip install`
make them. The venvs are made without pip of their own (ensurepip copies and installs pip
into each); this interpreter's pip installs into them with `--python`, the same resolver
and the same package index a user's pip would use."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

# pip runs as a user's would: no PYTHONPATH of the test run's (a checkout on it would show
# the project as installed already, and pip would skip installing it)
CLEAN_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def bare_venv(folder: Path) -> Path:
    """A new, empty virtualenv at `folder`; its python."""
    venv.EnvBuilder(with_pip=False, clear=True).create(folder)
    return folder / "bin" / "python"


def _pip(*args: str) -> str:
    """This interpreter's `pip ARGS`, without the test run's PYTHONPATH; its stdout."""
    run = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
        check=True,
        capture_output=True,
        text=True,
        env=CLEAN_ENV,
    )
    return run.stdout


def pip(python: Path, *args: str) -> str:
    """`pip ARGS` against the venv of `python`; its stdout."""
    return _pip("--python", str(python), *args)


def installed(python: Path) -> set[str]:
    """name==version of every package in the venv (`pip list --format=freeze`)."""
    return set(pip(python, "list", "--format=freeze").split())


def wheel(source: Path, into: Path) -> Path:
    """The wheel `pip install SOURCE` would build (no dependencies), built into `into`."""
    _pip("wheel", "--quiet", "--no-deps", "--wheel-dir", str(into), str(source))
    (built,) = into.glob("*.whl")
    return built

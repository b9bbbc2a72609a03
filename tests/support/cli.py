"""The command line as a user runs it: `python -m pipeline.cli` in a subprocess."""

from __future__ import annotations

import contextlib
import hashlib
import io
import subprocess
import sys
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.support.samples import REPO


def cli(
    *args: str | Path,
    cwd: Path = REPO,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """`rollout-shards ARGS` run from `cwd` (the repository unless told), its output as text;
    `env` replaces the environment when given."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=None if env is None else dict(env),
        timeout=timeout,
        check=False,
    )


def digests(root: Path) -> dict[str, str]:
    """Every file under root (step locks aside) by its path there: its sha256."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.parent.name != ".locks"
    }


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def in_process(args: list[str]) -> Result:
    """A command through `main` in this process; any exception escaping it is a failure,
    shown as the traceback a user would have seen."""
    from pipeline.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(args)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except Exception:  # noqa: BLE001 - reported as the traceback the CLI would print
            traceback.print_exc()
            code = 1
    return Result(code, out.getvalue(), err.getvalue())

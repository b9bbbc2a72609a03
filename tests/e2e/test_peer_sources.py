"""`make test`'s first check: without miles' and slime's source the run stops in about a
second with one line naming MILES_SOURCE, SLIME_SOURCE and the URLs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.support import miles as miles_support
from tests.support import slime as slime_support
from tests.support.samples import REPO

SCRIPT = REPO / "tests" / "peer_sources.py"


def _run(
    tmp_path: Path, url_base: str, command: list[str] | None = None, **env: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    """The script (or `command`) with git's URLs of GitHub mapped to `url_base`, an empty
    cache and no MILES_SOURCE / SLIME_SOURCE unless given."""
    config = tmp_path / "gitconfig"
    config.write_text(f'[url "{url_base}"]\n\tinsteadOf = https://github.com/\n')
    # nor the variables of a `make` this runs under (`make test`): the inner make is a user's
    unset = ("MILES_SOURCE", "SLIME_SOURCE", "MAKEFLAGS", "MAKELEVEL", "MFLAGS")
    base = {k: v for k, v in os.environ.items() if k not in unset}
    started = time.monotonic()
    done = subprocess.run(
        command or [sys.executable, str(SCRIPT)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={
            **base,
            "GIT_CONFIG_GLOBAL": str(config),
            "GIT_CONFIG_NOSYSTEM": "1",
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
            **env,
        },
        check=False,
    )
    return done, time.monotonic() - started


def test_unreachable_sources_stop_in_one_line(tmp_path: Path) -> None:
    done, seconds = _run(tmp_path, "file:///nowhere/")
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    for support in (miles_support, slime_support):
        assert f"{support.SOURCE_ENV} (a checkout of {support.URL})" in lines[0]
    assert seconds < 5


def test_make_test_stops_first_with_that_line(tmp_path: Path) -> None:
    done, seconds = _run(tmp_path, "file:///nowhere/", ["make", "test", f"PYTHON={sys.executable}"])
    assert done.returncode != 0
    assert done.stdout == ""  # nothing was installed, linted or run
    (line,) = done.stderr.splitlines()
    assert line.startswith("Makefile:") and line.endswith("Stop.")
    assert "MILES_SOURCE (a checkout of https://github.com/radixark/miles)" in line
    assert "SLIME_SOURCE (a checkout of https://github.com/THUDM/slime)" in line
    assert seconds < 5


def test_a_given_source_or_a_cached_clone_is_enough(tmp_path: Path) -> None:
    miles = tmp_path / "miles"
    miles.mkdir()
    done, _ = _run(tmp_path, "file:///nowhere/", MILES_SOURCE=str(miles))
    # only slime is missing now
    assert "MILES_SOURCE" not in done.stderr and "SLIME_SOURCE" in done.stderr
    (tmp_path / "cache" / "rollout-shards" / f"slime-{slime_support.PIN}").mkdir(parents=True)
    done, _ = _run(tmp_path, "file:///nowhere/", MILES_SOURCE=str(miles))
    assert (done.returncode, done.stderr) == (0, "")
    gone = tmp_path / "gone"
    done, _ = _run(tmp_path, "file:///nowhere/", MILES_SOURCE=str(gone))
    assert done.returncode == 1 and f"MILES_SOURCE={gone} does not exist" in done.stderr


def test_reachable_repositories_pass(tmp_path: Path) -> None:
    # this machine's own git configuration: the one `make test` sees
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(SCRIPT)],
        capture_output=True,
        text=True,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")},
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert time.monotonic() - started < 5

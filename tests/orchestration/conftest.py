"""Fixtures of the Dagster-level tests: configured roots and the session's Ray head (the
throwaway instance is tests/conftest.py's)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support.dagster_roots import Roots, configured_roots
from tests.support.shared import session_folder

if TYPE_CHECKING:
    from tests.support.ray_head import RayHead


@pytest.fixture
def roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Roots:
    """A copy of data/rollouts as the configured input root, an empty output root."""
    return configured_roots(tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayHead]:
    """One Ray head for the test modules that run at the same time, shared by the pytest
    workers (a head takes tens of seconds to start, minutes on a busy machine), and stopped
    when the last of them ends, not left idle to the end of the session. It asks for Ray's
    token (`RAY_AUTH_MODE=token`), so every Ray test goes through the jobs client's token."""
    # Imported here: Ray is a second of imports that only the Ray tests need.
    from tests.support.ray_head import shared_head

    with shared_head(session_folder(tmp_path_factory), auth=True) as head:
        yield head


@pytest.fixture
def ray_dashboard(ray_head: RayHead, monkeypatch: pytest.MonkeyPatch) -> str:
    """The session head's dashboard URL, with Ray's token in this test's environment (as a
    user of a token-auth cluster has it), which runs started by the test inherit."""
    for name, value in ray_head.environment().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    return ray_head.url

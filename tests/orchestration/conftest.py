"""Fixtures of the Dagster-level tests: a throwaway instance and configured roots."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from dagster_support import Roots, configured_roots


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    """A throwaway Dagster instance (temporary home, in-process runs)."""
    with dg.instance_for_test() as instance:
        yield instance


@pytest.fixture
def roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Roots:
    """A copy of data/rollouts as the configured input root, an empty output root."""
    return configured_roots(tmp_path, monkeypatch)

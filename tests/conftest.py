"""Fixtures every test folder sees. Plain helpers live in tests/support/."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def rows_dir(tmp_path: Path) -> Path:
    return tmp_path / "rollouts"

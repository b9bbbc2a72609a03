"""Fixtures of the miles tests: miles at the head of its PRs #1891/#1892 (`SPANS_PIN`)
with its data buffer, once per test module, and no loader hook left from another test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.miles_buffer import spans_modules


@pytest.fixture(scope="module")
def spans_miles(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with spans_modules(tmp_path_factory.mktemp("miles")) as modules:
        assert hasattr(modules.types, "WeightVersionsPerCall")
        yield modules


@pytest.fixture
def no_hook() -> Iterator[None]:
    """No hook from an earlier test (of this module or another) reads another folder."""
    from rollout_shards_loader import miles as hook

    hook.uninstall()
    yield
    hook.uninstall()

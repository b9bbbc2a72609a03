"""The trainer tests: the loader imported from source (it is its own distribution, loader/);
`slime`: slime's own modules on CPU (tests/support/slime.py), once per test module."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

LOADER = Path(__file__).resolve().parents[2] / "loader"
if str(LOADER) not in sys.path:
    sys.path.insert(0, str(LOADER))


@pytest.fixture(scope="module")
def slime() -> Iterator[Any]:
    from tests.support import slime as ss

    try:
        source = ss.slime_source()
    except ss.SourceMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    with ss.slime_modules(source) as modules:
        yield modules

"""tests/reference.py's slime reference against slime's own code at the pinned commit
(tests/loader/slime_support.py): each rank's dict after `process_rollout_data`, tensors by
dtype and values, floats bit for bit, over the issue's cases (tests/loader/slime_cases.py)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from tests import reference
from tests.loader import slime_support as ss
from tests.loader.slime_cases import CASES


@pytest.fixture(scope="module")
def slime() -> Iterator[Any]:
    try:
        source = ss.slime_source()
    except ss.SourceMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    with ss.slime_modules(source) as modules:
        yield modules


@pytest.mark.parametrize("name", CASES)
def test_reference_is_slime(slime: Any, name: str) -> None:
    rows, settings = CASES[name]
    theirs = ss.rank_dicts(slime, settings, copy.deepcopy(rows))
    ours = reference.slime_rank_dicts(copy.deepcopy(rows), settings)
    assert [ss.canonical(d) for d in ours] == [ss.canonical(d) for d in theirs]

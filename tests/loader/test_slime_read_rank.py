"""rollout_shards_loader.slime.read_rank against slime's own code at the pinned commit
(tests/loader/slime_support.py): each rank of a `--trainer slime` build read back equals the
dict slime's `process_rollout_data` returns for that rank after slime's conversion of the
same rows (keys and their order, Python and tensor types, dtypes, floats bit for bit), over
the issue's cases (tests/loader/slime_cases.py)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rollout_shards_loader import slime as slime_loader

from tests.conftest import build, write_step
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
def test_read_rank_is_slimes_dict(slime: Any, tmp_path: Path, name: str) -> None:
    rows, settings = CASES[name]
    write_step(tmp_path / "in", copy.deepcopy(rows))
    manifest = build(tmp_path / "in", tmp_path / "out", trainer="slime", **settings)
    assert manifest["settings"]["trainer"] == "slime"
    theirs = ss.rank_dicts(slime, settings, copy.deepcopy(rows))
    folder = tmp_path / "out" / "step=1"
    ours = [slime_loader.read_rank(folder, rank) for rank in range(len(theirs))]
    for rank, (mine, slimes) in enumerate(zip(ours, theirs, strict=True)):
        assert list(mine) == list(slimes), rank
        assert ss.canonical(mine) == ss.canonical(slimes), (rank, name)

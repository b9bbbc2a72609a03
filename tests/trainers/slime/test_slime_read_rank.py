"""rollout_shards_loader.slime.read_rank against slime's own code at the pinned commit
(tests/support/slime.py): each rank of a `--trainer slime` build read back equals the
dict slime's `process_rollout_data` returns for that rank after slime's conversion of the
same rows (keys and their order, Python and tensor types, dtypes, floats bit for bit), over
the issue's cases (tests/support/slime_cases.py)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from rollout_shards_loader import slime as slime_loader

from tests.support import slime as ss
from tests.support.samples import build, write_step
from tests.support.slime_cases import CASES, random_case


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


@pytest.mark.parametrize("name", ["extras_round_raw_source", "balance_by_flops"])
def test_rank_bounded_build_writes_the_same_bytes(tmp_path: Path, name: str) -> None:
    """A step built rank-bounded (`stream_above` 0) holds the in-memory build's bytes,
    slime's extra column included."""
    import hashlib

    rows, settings = CASES[name]
    write_step(tmp_path / "in", copy.deepcopy(rows))
    build(tmp_path / "in", tmp_path / "a", trainer="slime", **settings)
    build(tmp_path / "in", tmp_path / "b", trainer="slime", stream_above=0, **settings)

    def digests(root: Path) -> dict[str, str]:
        folder = root / "step=1"
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}

    assert digests(tmp_path / "a") == digests(tmp_path / "b")


def test_each_loader_refuses_the_other_trainers_step(tmp_path: Path) -> None:
    from rollout_shards_loader import read_rank

    rows, settings = CASES["dp1"]
    write_step(tmp_path / "in", copy.deepcopy(rows))
    build(tmp_path / "in", tmp_path / "slime", trainer="slime", **settings)
    build(tmp_path / "in", tmp_path / "miles", global_batch_size=8)
    with pytest.raises(ValueError, match="built for the slime trainer"):
        read_rank(tmp_path / "slime" / "step=1", 0)
    with pytest.raises(ValueError, match="built for the miles trainer"):
        slime_loader.read_rank(tmp_path / "miles" / "step=1", 0)


def test_no_slime_source_fails_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ss.SOURCE_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(ss.SourceMissing) as caught:
        ss.slime_source()
    message = str(caught.value)
    assert ss.SOURCE_ENV in message and "\n" not in message


def test_read_rank_without_torch_is_one_line(tmp_path: Path) -> None:
    """Where torch is missing (a trainer environment that is not slime's) the reader says
    so in one line, before it reads anything, and no traceback of torch's import."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "sys.modules['torch'] = None  # as if torch were not installed\n"
        "from rollout_shards_loader import slime\n"
        "try:\n"
        "    slime.read_rank(sys.argv[1], 0)\n"
        "except ImportError as error:\n"
        "    print(repr(error))\n"
    )
    loader = str(Path(__file__).resolve().parents[3] / "loader")
    run = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "no-step")],
        capture_output=True,
        text=True,
        env={"PATH": "", "PYTHONPATH": loader},
        check=True,
    )
    assert run.stdout == (
        "ImportError(\"rollout_shards_loader.slime.read_rank runs in slime's environment "
        '(torch is not installed): install the loader where slime runs")\n'
    )


@pytest.mark.parametrize("seed", range(40))
def test_read_rank_is_slimes_dict_on_random_cases(slime: Any, tmp_path: Path, seed: int) -> None:
    """Drawn cases (tests/trainers/slime/test_slime_reference.py): where slime's code builds the
    dicts, each rank read back equals them; where it asserts, the build refuses the step."""
    from pipeline.errors import StepError

    rows, settings = random_case(seed)
    write_step(tmp_path / "in", copy.deepcopy(rows))
    try:
        theirs = ss.rank_dicts(slime, settings, copy.deepcopy(rows))
    except AssertionError:
        with pytest.raises(StepError):
            build(tmp_path / "in", tmp_path / "out", trainer="slime", **settings)
        return
    build(tmp_path / "in", tmp_path / "out", trainer="slime", **settings)
    folder = tmp_path / "out" / "step=1"
    ours = [slime_loader.read_rank(folder, rank) for rank in range(len(theirs))]
    assert [ss.canonical(d) for d in ours] == [ss.canonical(d) for d in theirs]


def test_a_rank_shipped_alone_keeps_slimes_columns(tmp_path: Path) -> None:
    """What one rank's writer is shipped (`RankRows.for_rank`, the Ray rank writers) writes
    the same rows and columns as the whole batch, `source_names` included."""
    from tests.support.samples import plan

    rows, settings = CASES["extras_round_raw_source"]
    write_step(tmp_path / "in", copy.deepcopy(rows))
    batch = plan(tmp_path / "in", trainer="slime", **settings)
    rank_rows = batch.rank_rows
    assert rank_rows is not None
    whole = rank_rows.rows(0, rank_rows.scalars.height)
    assert "source_names" in whole.columns
    start = 0
    for rank in range(settings["dp_size"]):
        size = int((whole.get_column("rank") == rank).sum())
        alone = rank_rows.for_rank(start, size)
        assert alone.rows(0, size).equals(whole.slice(start, size))
        start += size


def test_stages_run_apart_build_the_same_slime_step(tmp_path: Path) -> None:
    """Each stage run on its own (the Dagster assets materialized apart, through staging)
    gives the bytes of a build in one go."""
    import hashlib

    from pipeline.settings import load_settings
    from pipeline.step import stages
    from pipeline.step.roots import StepRoots

    rows, settings = CASES["extras_round_raw_source"]
    write_step(tmp_path / "in", copy.deepcopy(rows))
    build(tmp_path / "in", tmp_path / "a", trainer="slime", **settings)
    roots = StepRoots(tmp_path / "in", tmp_path / "b")
    config = load_settings(trainer="slime", **settings)
    for name in stages.STAGES:
        list(stages.run_stages([name], roots, 1, config))

    def digests(root: Path) -> dict[str, str]:
        folder = root / "step=1"
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}

    assert digests(tmp_path / "a") == digests(tmp_path / "b")

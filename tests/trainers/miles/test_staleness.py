"""max_weight_staleness against miles' own data buffer on CPU (tests/support/miles.py):
its `DefaultDataBuffer` takes the step's prompt groups and hands back the ones it keeps for
engine version N (the step); the groups the build sets aside are exactly the ones it drops,
they land in the quarantine with a reason naming both versions, they count as quarantined
whatever on_invalid says, and the rank files are those of a build of the kept rows alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from pipeline.errors import StepError, UsageError
from pipeline.manifest import Manifest
from pipeline.settings import load_settings
from pipeline.step.build import summary_line
from tests import reference
from tests.support import miles as ms
from tests.support.miles_buffer import buffer_kept
from tests.support.samples import build, sample, trajectory, write_step

STEP = 9


@pytest.fixture(scope="module")
def miles(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """miles' modules, kept after their import context closes: a build run inside it would
    import the project's lazy imports (pydantic's parts) only to have them unloaded."""
    return ms.kept_modules(tmp_path_factory, buffer="miles.rollout.fully_async_data_buffer")


def rows_of(versions: list[list[list[str]]]) -> list[dict[str, Any]]:
    """One prompt group per entry, one trajectory per inner list (its versions): group g's
    trajectories are single rows, but group 1's first one has two v2 leaves."""
    rows = []
    index = 0
    for group, trajectories in enumerate(versions):
        for own in trajectories:
            leaves = 2 if group == 1 and own is trajectories[0] else 1
            rows += trajectory(
                index,
                group,
                leaves,
                index,
                weight_versions=own,
                reward=float(index % 3),
                response_length=1 + index % 4,
            )
            index += 1
    return rows


# The newest version in the data (6) is not the step (9).
VERSIONS = [
    [["6"], ["6", "5"]],
    [["3", "6"], ["6"]],
    [["8"], ["9"]],
    [["4"], ["x", "7"]],
    [[], ["not-a-number"]],  # no numeric version: kept whatever the budget
    [["5"], ["2"]],
    [["00007"], ["6"]],
    [["10"], ["1"]],
]


def miles_dropped(miles: Any, rows: list[dict[str, Any]], budget: int) -> tuple[list[int], float]:
    """The group_index of each group miles' buffer drops at engine version STEP, and its
    stale_groups_filtered metric."""
    groups: dict[int, list[Any]] = {}
    for row, one in zip(rows, ms.samples(miles, rows), strict=True):
        groups.setdefault(row["group_index"], []).append(one)
    (last,) = ms.samples(miles, [sample(10**6, group_index=10**6)])
    kept, metrics = buffer_kept(miles, groups, last, STEP, budget)
    dropped = [g for g in groups if g not in kept]
    return dropped, metrics["rollout/fully_async/stale_groups_filtered"]


@pytest.mark.parametrize("on_invalid", ["fail", "quarantine"])
@pytest.mark.parametrize("budget", [0, 1, 2, 3, 100])
def test_groups_set_aside_are_the_ones_miles_buffer_drops(
    miles: Any, budget: int, on_invalid: str, tmp_path: Path
) -> None:
    rows = rows_of(VERSIONS)
    dropped, metric = miles_dropped(miles, rows, budget)
    assert dropped == reference.stale_groups(rows, STEP, budget)
    write_step(tmp_path / "in", rows, step=STEP)
    chosen = {
        "global_batch_size": 2,
        "dp_size": 2,
        "cp_size": 1,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 100,
        "on_invalid": on_invalid,
    }
    meta = build(tmp_path / "in", tmp_path / "out", max_weight_staleness=budget, **chosen)
    stale_rows = [row for row in rows if row["group_index"] in dropped]
    assert meta["counts"]["quarantined"] == len(stale_rows)
    assert meta["stats"]["rollout/fully_async/stale_groups_filtered"] == metric == len(dropped)
    assert meta["stats"]["rollout/fully_async/stale_rows_filtered"] == len(stale_rows)
    line = summary_line(Manifest.from_json(json.dumps(meta)), tmp_path)
    groups = f"{len(dropped)} stale group" + ("" if len(dropped) == 1 else "s")
    assert f"{len(stale_rows)} quarantined ({groups}, {len(stale_rows)} row" in line
    if dropped:
        quarantine = pl.read_parquet(tmp_path / "out" / "_quarantine" / f"step={STEP}.parquet")
        assert quarantine.get_column("index").to_list() == [r["index"] for r in stale_rows]
        for reason, group in zip(quarantine["reason"], quarantine["group_index"], strict=True):
            assert reason.startswith(f"max_weight_staleness: prompt group {group} is ")
            assert f"(step {STEP}, oldest weight version " in reason
    # the rank-bounded build sets the same groups aside, byte for byte
    bounded = build(
        tmp_path / "in", tmp_path / "bounded", max_weight_staleness=budget, stream_above=0, **chosen
    )
    assert [o["sha256"] for o in bounded["outputs"]] == [o["sha256"] for o in meta["outputs"]]
    # the rest is built exactly as the kept rows alone
    kept = [row for row in rows if row["group_index"] not in dropped]
    write_step(tmp_path / "kept", kept, step=STEP)
    alone = build(tmp_path / "kept", tmp_path / "alone", **chosen)
    for ours, theirs in zip(meta["outputs"], alone["outputs"], strict=False):
        if ours["path"].startswith("rank="):
            assert ours["sha256"] == theirs["sha256"]


def test_budget_needs_group_index_and_ascii_versions(tmp_path: Path) -> None:
    settings = load_settings(global_batch_size=1, max_weight_staleness=1)
    from pipeline.trainers.miles.staleness import stale_rows

    frame = pl.DataFrame(
        {"_row_id": [0, 1], "index": [0, 1], "leaf": [0, 0], "group_index": [0, None]}
    ).with_columns(pl.Series("weight_versions", [["1"], ["2"]]))
    with pytest.raises(StepError) as error:
        stale_rows(frame, STEP, settings.max_weight_staleness)
    assert error.value.violations[0].rule == "staleness_needs_group_index"
    frame = frame.with_columns(
        pl.Series("group_index", [0, 1]), pl.Series("weight_versions", [["1"], ["٣"]])
    )
    with pytest.raises(StepError) as error:
        stale_rows(frame, STEP, 1)
    assert error.value.violations[0].rule == "weight_version_not_ascii"
    with pytest.raises(UsageError, match="greater than or equal to 0"):
        load_settings(global_batch_size=1, max_weight_staleness=-1)


def test_versions_past_int64_are_refused() -> None:
    """miles reads them as Python integers, which no column type here holds: the step is
    refused naming the rows (int64's largest version is read)."""
    from pipeline.errors import StepError
    from pipeline.trainers.miles.staleness import stale_rows

    frame = pl.DataFrame(
        {"_row_id": [0, 1, 2], "index": [0, 1, 2], "leaf": [0, 0, 0], "group_index": [0, 0, 1]}
    ).with_columns(
        pl.Series("weight_versions", [["99999999999999999999999"], ["3"], ["9223372036854775808"]])
    )
    with pytest.raises(StepError) as refused:
        stale_rows(frame, STEP, 1)
    (violation,) = refused.value.violations
    assert (violation.rule, violation.rows) == ("weight_version_beyond_int64", [(0, 0), (2, 0)])
    largest = frame.with_columns(pl.Series("weight_versions", [[str(2**63 - 1)], ["3"], ["9"]]))
    assert stale_rows(largest, STEP, 1).get_column("_row_id").to_list() == [0, 1]

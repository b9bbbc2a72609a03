"""`rollout_id_policy: repair` for data from before the rollout-id rule was fixed
(pipeline/transforms/repair.py): ids cleared on v1 rows and single-row trajectories
(before miles PR #2536), missing ids stamped on v2 multi-leaf leaves (before PR #2368),
each repaired row counted per rule; `strict` repairs nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from pipeline import columns as c
from pipeline.errors import StepError
from pipeline.schemas.validate import QUARANTINE_HINT, REPAIR_HINT
from pipeline.transforms.repair import CLEARED, STAMPED, repair_rollout_ids
from tests.support.samples import build, only_refused, ranks, sample, table, write_step

V1 = {"session_version": "v1"}
V2 = {"session_version": "v2"}
REPAIR = {"rollout_id_policy": "repair"}


def pre_2536() -> list[dict]:
    """v1 rows and v2 singletons stamped with their index, as miles did before #2536."""
    return [
        *(sample(i, rollout_id=i, **V1) for i in range(3)),
        *(sample(i, rollout_id=i, **V2) for i in range(3, 6)),
        sample(6, **V1),
        sample(7, **V2),
    ]


def pre_2368() -> list[dict]:
    """v2 multi-leaf trajectories without ids, as miles wrote them before #2368."""
    return [
        *(sample(0, leaf, reward=1.0, **V2) for leaf in range(3)),
        *(sample(1, leaf, **V2) for leaf in range(2)),
        sample(2, **V2),
        sample(3, **V1),
    ]


def test_repair_transform_exact() -> None:
    frame = table(
        [
            sample(0, rollout_id=0, **V1),
            sample(1, rollout_id=1, **V2),
            sample(2, 0, **V2),
            sample(2, 1, **V2),
            sample(3, 0, rollout_id=30, **V2),
            sample(3, 1, **V2),
            sample(4, 0, rollout_id=4, **V2),
            sample(4, 1, rollout_id=4, **V2),
            sample(5, rollout_id=5),
        ]
    ).with_columns(pl.lit(1, dtype=pl.Int64).alias(c.STEP))
    repaired, counts = repair_rollout_ids(frame)
    assert repaired.get_column(c.ROLLOUT_ID).to_list() == [None, None, 2, 2, 30, 30, 4, 4, None]
    assert counts == {CLEARED: 3, STAMPED: 3}
    assert repaired.drop(c.ROLLOUT_ID).equals(frame.drop(c.ROLLOUT_ID))


def test_repair_clears_ids_of_the_pre_2536_window(rows_dir: Path, tmp_path: Path) -> None:
    write_step(rows_dir, pre_2536())
    manifest = build(rows_dir, tmp_path / "out", global_batch_size=4, **REPAIR)
    assert manifest["repaired"] == {CLEARED: 6, STAMPED: 0}
    assert manifest["counts"]["repaired"] == 6
    assert manifest["counts"]["written"] == 8
    assert manifest["is_compact"] is False
    (shard,) = ranks(tmp_path / "out")
    assert shard.get_column("rollout_ids").to_list() == list(range(8))


@pytest.mark.parametrize(
    ("window", "global_batch_size", "expected"),
    [
        (pre_2536, 4, {"n_rows": 6}),
        (pre_2368, 2, {"rows": [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]}),
    ],
    ids=["pre_2536", "pre_2368"],
)
def test_strict_refuses_the_window(
    window: Callable[[], list[dict]],
    global_batch_size: int,
    expected: dict[str, Any],
    rows_dir: Path,
    tmp_path: Path,
) -> None:
    write_step(rows_dir, window())
    with pytest.raises(StepError) as error:
        build(rows_dir, tmp_path / "out", global_batch_size=global_batch_size)
    (violation,) = error.value.violations
    assert violation.rule == "rollout_id_only_on_v2_multi_leaf"
    assert {name: getattr(violation, name) for name in expected} == expected
    assert only_refused(tmp_path / "out", 1)


def test_repair_stamps_ids_of_the_pre_2368_window(rows_dir: Path, tmp_path: Path) -> None:
    write_step(rows_dir, pre_2368())
    manifest = build(rows_dir, tmp_path / "out", global_batch_size=2, **REPAIR)
    assert manifest["repaired"] == {CLEARED: 0, STAMPED: 5}
    assert manifest["counts"]["repaired"] == 5
    assert manifest["is_compact"] is True
    assert manifest["counts"]["trimmed"] == 0
    (shard,) = ranks(tmp_path / "out")
    assert shard.get_column("rollout_ids").to_list() == [0, 0, 0, 1, 1, 2, 3]
    assert shard.get_column("rollout_mask_sums").to_list() == [6, 6, 6, 4, 4, 2, 2]


def test_both_windows_in_one_step(rows_dir: Path, tmp_path: Path) -> None:
    rows = [
        *(sample(i, leaf, **V2) for i in (0, 1) for leaf in (0, 1)),
        *(sample(i, rollout_id=i, **V2) for i in (2, 3)),
        sample(4, rollout_id=4, **V1),
    ]
    write_step(rows_dir, rows)
    manifest = build(rows_dir, tmp_path / "out", global_batch_size=2, **REPAIR)
    assert manifest["repaired"] == {CLEARED: 3, STAMPED: 4}
    assert manifest["counts"]["repaired"] == 7


def test_strict_and_repair_agree_on_data_that_needs_none(rows_dir: Path, tmp_path: Path) -> None:
    rows = [sample(0, leaf, rollout_id=0, **V2) for leaf in (0, 1)] + [sample(1, **V1)]
    write_step(rows_dir, rows)
    strict = build(rows_dir, tmp_path / "strict", global_batch_size=2)
    repair = build(rows_dir, tmp_path / "repair", global_batch_size=2, **REPAIR)
    for manifest in (strict, repair):
        assert manifest["repaired"] == {CLEARED: 0, STAMPED: 0}
        assert manifest["counts"]["repaired"] == 0
    assert strict["outputs"] == repair["outputs"]


def test_repair_leaves_what_no_legacy_window_wrote(rows_dir: Path, tmp_path: Path) -> None:
    rows = [
        sample(0, rollout_id=7),  # no session version: a singleton, cleared
        sample(1, 0, rollout_id=10, **V2),  # siblings with two ids
        sample(1, 1, rollout_id=11, **V2),
        sample(2, 0, rollout_id=2),  # rows sharing an index without v2: duplicates
        sample(2, 1, rollout_id=2),
    ]
    write_step(rows_dir, rows)
    with pytest.raises(StepError) as error:
        build(rows_dir, tmp_path / "out", global_batch_size=1, **REPAIR)
    found = {v.rule: (v.rows, v.message) for v in error.value.violations}
    assert found["rollout_id_shared_by_siblings"][0] == [(1, 0), (1, 1)]
    assert found["rollout_id_only_on_v2_multi_leaf"][0] == [(2, 0), (2, 1)]
    assert found["multi_leaf_only_in_v2"][0] == [(2, 0), (2, 1)]
    # repair ran and these rows are still refused: the line does not send the user to it
    assert "--rollout-id-policy repair" not in found["rollout_id_only_on_v2_multi_leaf"][1]


def test_a_singleton_without_a_session_version_is_cleared(rows_dir: Path, tmp_path: Path) -> None:
    """A table of miles samples says no session version (miles stores none): a single row
    with an id is a v1 row or a v2 singleton, and repair clears the id of both, so the
    line's hint holds for it and repair builds the step."""
    rows = [sample(i, rollout_id=i) for i in range(4)]
    write_step(rows_dir, rows)
    with pytest.raises(StepError) as error:
        build(rows_dir, tmp_path / "strict", global_batch_size=2)
    (violation,) = error.value.violations
    assert violation.rule == "rollout_id_only_on_v2_multi_leaf"
    # one reward group (no group_index): quarantine is named as no way out
    assert f"{REPAIR_HINT}; --on-invalid quarantine cannot set them aside: " in violation.message
    assert QUARANTINE_HINT not in violation.message
    manifest = build(rows_dir, tmp_path / "out", global_batch_size=2, **REPAIR)
    assert manifest["repaired"] == {CLEARED: 4, STAMPED: 0}
    assert manifest["is_compact"] is False
    (shard,) = ranks(tmp_path / "out")
    assert shard.get_column("rollout_ids").to_list() == [0, 1, 2, 3]


def test_the_hint_only_where_repair_repairs(rows_dir: Path, tmp_path: Path) -> None:
    """Rows sharing an index without v2 (a v2 trajectory whose session version is not
    given, or copies) are not repaired: their line names no repair."""
    write_step(rows_dir, [sample(0, leaf, rollout_id=0) for leaf in (0, 1)])
    with pytest.raises(StepError) as error:
        build(rows_dir, tmp_path / "out", global_batch_size=1)
    found = {v.rule: v.message for v in error.value.violations}
    assert "--rollout-id-policy repair" not in found["rollout_id_only_on_v2_multi_leaf"]
    assert "multi_leaf_only_in_v2" in found


def test_a_stamped_id_still_has_to_be_unique(rows_dir: Path, tmp_path: Path) -> None:
    rows = [sample(0, leaf, **V2) for leaf in (0, 1)]
    rows += [sample(5, leaf, rollout_id=0, **V2) for leaf in (0, 1)]
    write_step(rows_dir, rows)
    with pytest.raises(StepError) as error:
        build(rows_dir, tmp_path / "out", global_batch_size=1, **REPAIR)
    assert [v.rule for v in error.value.violations] == ["rollout_key_unique_per_trajectory"]


def test_the_repaired_counts_are_in_the_manifest_file(rows_dir: Path, tmp_path: Path) -> None:
    write_step(rows_dir, pre_2536())
    build(rows_dir, tmp_path / "out", global_batch_size=4, **REPAIR)
    written = json.loads((tmp_path / "out" / "step=1" / "manifest.json").read_text())
    assert written["repaired"] == {CLEARED: 6, STAMPED: 0}
    assert written["settings"]["rollout_id_policy"] == "repair"

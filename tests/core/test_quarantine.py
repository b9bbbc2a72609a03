"""`on_invalid: quarantine`: whole invalid trajectories are set aside with their original
columns and a reason, the rest is built, and the counts add up (pipeline/build.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from pipeline.errors import StepError
from tests.support.samples import build, only_refused, plan, write_step
from tests.support.samples import sample as one_row

V2 = {"session_version": "v2"}
Q = {"on_invalid": "quarantine", "global_batch_size": 2}
MASK_LENGTH = "loss_mask_length: loss_mask length must equal response_length"
WITHIN = "response_within_tokens: response_length must be within 0..len(tokens)"
SIBLING = "sibling of an invalid leaf: "


def sample(index: int, leaf: int = 0, **fields: Any) -> dict[str, Any]:
    """A row of its own prompt group (`group_index` = its index): quarantine then sets aside
    its trajectory and no more (SEMANTICS 5.4; tests/core/test_reward_groups.py has the
    groups of several rows)."""
    return one_row(index, leaf, **{"group_index": index, **fields})


def quarantine_of(out: Path, step: int = 1) -> pl.DataFrame:
    return pl.read_parquet(out / "_quarantine" / f"step={step}.parquet")


def manifest_of(out: Path, step: int = 1) -> dict[str, Any]:
    return json.loads((out / f"step={step}" / "manifest.json").read_text())


def test_a_whole_trajectory_goes_to_quarantine(rows_dir: Path, tmp_path: Path) -> None:
    rows = [sample(i, reward=float(i)) for i in range(4)]
    rows += [sample(4, leaf, rollout_id=4, **V2) for leaf in range(3)]
    rows[5]["loss_mask"] = [1]
    write_step(rows_dir, rows)
    manifest = build(rows_dir, tmp_path / "out", **Q)
    table = quarantine_of(tmp_path / "out")
    assert table.select("index", "leaf", "rollout_id", "reason").rows() == [
        (4, 0, 4, SIBLING + MASK_LENGTH),
        (4, 1, 4, MASK_LENGTH),
        (4, 2, 4, SIBLING + MASK_LENGTH),
    ]
    assert manifest["counts"] == {
        "ingested": 7,
        "quarantined": 3,
        "repaired": 0,
        "trimmed": 0,
        "dropped": 0,
        "written": 4,
        "untrained": 0,
    }
    assert manifest["is_compact"] is False
    (quarantined,) = [o for o in manifest["outputs"] if o["path"].startswith("../_quarantine/")]
    assert {"path": "../_quarantine/step=1.parquet", "rows": 3}.items() <= quarantined.items()
    shard = pl.read_parquet(tmp_path / "out" / "step=1" / "rank=0.parquet")
    assert shard.get_column("sample_indices").to_list() == [0, 1, 2, 3]


def test_quarantine_keeps_the_rows_as_they_were_read(rows_dir: Path, tmp_path: Path) -> None:
    rows = [sample(i, prompt=f"question {i}", metadata='{"judge": "x"}') for i in range(4)]
    rows[2].update(response_length=9)
    path = write_step(rows_dir, rows)
    build(rows_dir, tmp_path / "out", **Q)
    table = quarantine_of(tmp_path / "out")
    read = pl.read_parquet(path)
    added = ["step", "remove_sample"]  # the path's step and remove_sample's default
    assert table.columns == [*read.columns, *added, "source_file", "source_row", "reason"]
    assert table.select(read.columns).equals(read[2])
    assert table.select(added).rows() == [(1, False)]
    assert table.select("source_file", "source_row", "reason").rows() == [(str(path), 2, WITHIN)]


def test_a_row_gets_every_rule_it_broke(rows_dir: Path, tmp_path: Path) -> None:
    rows = [sample(i) for i in range(4)]
    rows[1].update(tokens=[1, 2], response_length=3, loss_mask=[1])
    write_step(rows_dir, rows)
    build(rows_dir, tmp_path / "out", **Q)
    assert quarantine_of(tmp_path / "out").get_column("reason").to_list() == [
        f"{WITHIN}; {MASK_LENGTH}"
    ]


def test_values_of_the_wrong_type_quarantine_their_rows(rows_dir: Path, tmp_path: Path) -> None:
    rows_dir.mkdir()
    rows = [sample(i) for i in range(5)]
    rows[1]["response_length"] = "two"
    rows[3]["index"] = "three"
    (rows_dir / "step=1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    manifest = build(rows_dir, tmp_path / "out", **Q)
    table = quarantine_of(tmp_path / "out")
    assert table.select("index", "response_length", "source_row", "reason").rows() == [
        (1, None, 1, "column_type: column response_length must be Int32"),
        (None, 2, 3, "column_type: column index must be Int64"),
    ]
    assert manifest["counts"]["quarantined"] == 2
    assert manifest["counts"]["written"] == 2


def test_fail_mode_reports_a_wrong_type_once(rows_dir: Path) -> None:
    rows_dir.mkdir()
    rows = [sample(i) for i in range(4)]
    rows[1]["response_length"] = "two"
    rows[2]["status"] = "done"
    (rows_dir / "step=1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(StepError) as error:
        plan(rows_dir, global_batch_size=2)
    assert [(v.rule, v.rows) for v in error.value.violations] == [
        ("column_type", [(1, 0)]),
        ("status_isin", [(2, 0)]),
    ]
    # the reader's type line as the reader words it; the quarantine hint on the rule's line
    # (docs/bad-data.md: "For a row rule ... the hint")
    assert error.value.violations[0].message == (
        'column response_length must be Int32, got "two" at file row 2'
    )
    assert error.value.violations[1].message.endswith(
        "; --on-invalid quarantine would set these trajectories aside and build the rest"
    )


def test_trajectories_sharing_a_rollout_id_both_go(rows_dir: Path, tmp_path: Path) -> None:
    rows = [sample(i) for i in range(4)]
    rows += [sample(i, leaf, rollout_id=9, **V2) for i in (4, 5) for leaf in (0, 1)]
    write_step(rows_dir, rows)
    manifest = build(rows_dir, tmp_path / "out", **Q)
    table = quarantine_of(tmp_path / "out")
    assert table.select("index", "leaf").rows() == [(4, 0), (4, 1), (5, 0), (5, 1)]
    assert set(table.get_column("reason")) == {
        "rollout_key_unique_per_trajectory: a rollout key (rollout_id, else index) must belong "
        "to exactly one trajectory of the step; two trajectories share it"
    }
    assert manifest["counts"]["written"] == 4


def test_a_valid_step_has_no_quarantine(rows_dir: Path, tmp_path: Path) -> None:
    write_step(rows_dir, [sample(i) for i in range(4)])
    manifest = build(rows_dir, tmp_path / "out", **Q)
    assert manifest["counts"]["quarantined"] == 0
    assert not (tmp_path / "out" / "_quarantine" / "step=1.parquet").exists()
    assert [o["path"] for o in manifest["outputs"]] == ["rank=0.parquet", "report.html"]


def test_counts_add_up_with_repair_trim_and_quarantine(rows_dir: Path, tmp_path: Path) -> None:
    rows = [sample(i, session_version="v1", rollout_id=i if i < 3 else None) for i in range(7)]
    rows[5]["loss_mask"] = [1, 2]
    write_step(rows_dir, rows)
    manifest = build(rows_dir, tmp_path / "out", rollout_id_policy="repair", **Q)
    n = manifest["counts"]
    assert n == {
        "ingested": 7,
        "quarantined": 1,
        "repaired": 3,
        "trimmed": 0,
        "dropped": 0,
        "written": 6,
        "untrained": 0,
    }
    assert n["ingested"] == n["quarantined"] + n["trimmed"] + n["dropped"] + n["written"]


def test_quarantine_shows_ids_as_read_before_repair(rows_dir: Path, tmp_path: Path) -> None:
    rows = [sample(i, session_version="v1") for i in range(4)]
    rows[1].update(rollout_id=41, loss_mask=[1, 1, 1])
    write_step(rows_dir, rows)
    manifest = build(rows_dir, tmp_path / "out", rollout_id_policy="repair", **Q)
    assert quarantine_of(tmp_path / "out").select("index", "rollout_id").rows() == [(1, 41)]
    assert manifest["repaired"] == {"cleared_on_v1_or_singleton": 1, "stamped_on_v2_multi_leaf": 0}


def test_problems_without_rows_fail_the_step_even_in_quarantine(
    rows_dir: Path, tmp_path: Path
) -> None:
    folder = rows_dir / "step=1"
    write_step(folder, [sample(i) for i in range(4)], step=0).rename(folder / "part-0.parquet")
    write_step(folder, [{k: v for k, v in sample(i).items() if k != "tokens"} for i in (4, 5)])
    with pytest.raises(StepError) as error:
        build(rows_dir, tmp_path / "out", **Q)
    assert [v.rule for v in error.value.violations] == ["missing_column"]
    assert only_refused(tmp_path / "out", 1)


def test_a_struct_reward_without_reward_key_fails_in_quarantine(
    rows_dir: Path, tmp_path: Path
) -> None:
    write_step(rows_dir, [sample(i, reward={"score": 1.0}) for i in range(4)])
    with pytest.raises(StepError) as error:
        build(rows_dir, tmp_path / "out", **Q)
    (violation,) = error.value.violations
    assert violation.rule == "reward_key"
    assert violation.files == [str(rows_dir / "step=1.parquet")]


def test_too_few_rows_left_says_how_many_were_quarantined(rows_dir: Path, tmp_path: Path) -> None:
    write_step(rows_dir, [sample(i, status="done" if i else "completed") for i in range(4)])
    with pytest.raises(StepError) as error:
        build(rows_dir, tmp_path / "out", **Q)
    (violation,) = error.value.violations
    assert violation.rule == "not_enough_samples"
    assert violation.message.startswith(
        "not enough samples 1 for global_batch_size 2; --global-batch-size 1 is the largest "
        "this step fills (a multiple of dp_size 1 whose trim cuts no reward group) "
        "(left after quarantining 3 rows"
    )


def test_fail_mode_writes_nothing(rows_dir: Path, tmp_path: Path) -> None:
    rows = [sample(i) for i in range(4)]
    rows[0]["loss_mask"] = [1]
    write_step(rows_dir, rows)
    with pytest.raises(StepError):
        build(rows_dir, tmp_path / "out", global_batch_size=2)
    assert only_refused(tmp_path / "out", 1)

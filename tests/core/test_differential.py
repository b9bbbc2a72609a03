"""Differential test: the vectorised pipeline against the naive per-sample reference
(tests/reference.py) on random valid tables and random settings, every shard column and
the rank layout."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import columns as c
from pipeline.errors import StepError
from tests.reference import reference_build
from tests.support.samples import plan, write_step

KINDS = ("plain", "v1", "v2_multi", "v2_single")


@st.composite
def trajectories(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A valid step: trajectories of every kind, siblings sharing id and reward."""
    count = draw(st.integers(1, 14))
    with_groups = draw(st.booleans())
    with_log_probs = draw(st.booleans())
    struct_reward = draw(st.booleans())
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=count, max_size=count))
    rows = []
    for index, kind in enumerate(kinds):
        leaves = draw(st.integers(2, 4)) if kind == "v2_multi" else 1
        reward = draw(st.sampled_from([0.0, 0.5, 1.0, 0.7, -2.0, 3.25]))
        stamp = draw(st.sampled_from([index, 1000 + index])) if kind == "v2_multi" else None
        session = {"plain": None, "v1": "v1"}.get(kind, "v2")
        group = draw(st.integers(0, 3))
        for leaf in range(leaves):
            response = draw(st.integers(0, 5))
            prompt = draw(st.integers(1, 3))
            mask = draw(
                st.one_of(
                    st.none(), st.lists(st.integers(0, 1), min_size=response, max_size=response)
                )
            )
            row = {
                "index": index,
                "leaf": leaf,
                "rollout_id": stamp,
                "session_version": session,
                "status": draw(st.sampled_from(["completed", "truncated", "aborted"])),
                "tokens": list(range(prompt + response)),
                "response_length": response,
                "loss_mask": mask,
                "reward": {"score": reward, "format": float(leaf)} if struct_reward else reward,
                "remove_sample": draw(st.booleans()),
            }
            if with_groups:
                row["group_index"] = group
            if with_log_probs:
                row["rollout_log_probs"] = [-0.5 * (i + 1) for i in range(response)]
            rows.append(row)
    return rows


@st.composite
def build_settings(draw: st.DrawFn) -> dict[str, Any]:
    dp_size = draw(st.integers(1, 4))
    chosen = {
        "global_batch_size": dp_size * draw(st.integers(1, 4)),
        "dp_size": dp_size,
        "disable_rollout_trim_samples": draw(st.booleans()),
        "advantage_estimator": draw(
            st.sampled_from(["grpo", "gspo", "reinforce_plus_plus_baseline", "ppo"])
        ),
        "rewards_normalization": draw(st.booleans()),
        "grpo_std_normalization": draw(st.booleans()),
        "reward_key": "score",
    }
    if not chosen["disable_rollout_trim_samples"]:
        chosen["use_dynamic_global_batch_size"] = draw(st.booleans())
    if draw(st.booleans()):
        chosen["n_samples_per_prompt"] = draw(st.integers(1, 4))
        chosen["rollout_batch_size"] = draw(st.integers(1, 6))
    return chosen


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=trajectories(), chosen=build_settings())
def test_pipeline_matches_reference(rows: list[dict[str, Any]], chosen: dict[str, Any]) -> None:
    try:
        expected = reference_build([dict(r) for r in rows], chosen)
    except ValueError:
        expected = None
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "in"
        write_step(root, rows)
        try:
            batch = plan(root, **chosen)
        except StepError as exc:
            assert expected is None, f"pipeline refused what the reference accepts: {exc}"
            return
    assert expected is not None, "pipeline accepted what the reference refuses"
    meta = batch.meta.to_dict()
    assert meta["is_compact"] == expected["is_compact"]
    assert meta["global_batch_size"] == expected["global_batch_size"]
    assert meta["dynamic_global_batch_size"] == expected["dynamic_global_batch_size"]
    assert meta["counts"]["trimmed"] == expected["trimmed"]
    assert meta["counts"]["untrained"] == expected["untrained"]
    assert meta["equal_reward_groups"] == expected["equal_reward_groups"]
    absent = [n for n in c.OPTIONAL_SHARD_COLUMNS if n not in batch.meta.present_columns]
    frame = batch.frame
    assert frame.select(absent).null_count().row(0) == (frame.height,) * len(absent)
    assert frame.get_column("step").unique().to_list() == [1]
    for rank, want_rows in enumerate(expected["ranks"]):
        got = frame.filter(pl.col("rank") == rank).drop("rank", "step", *absent)
        assert got.height == len(want_rows)
        want = pl.DataFrame(want_rows, infer_schema_length=None) if want_rows else None
        if want is None:
            continue
        assert set(got.columns) == set(want.columns)
        for column in got.columns:
            left, right = got.get_column(column).to_list(), want.get_column(column).to_list()
            if column in ("rewards", "raw_reward"):
                # bit for bit: the reference sums in torch's float32 order, and so do we
                assert [float(a).hex() for a in left] == [float(b).hex() for b in right], column
            elif column == "rollout_log_probs":
                assert [[float(x) for x in v] for v in left] == right, column
            else:
                assert left == right, column

"""Quarantine and trimming keep reward groups whole (SEMANTICS 5.4), for every trainer: the
worked cases of the docs, the lines a build prints, and a differential test against
tests/reference.py: every written row's reward is the one its group, as the step gave it,
normalizes it to; every quarantined row is an invalid one or a member of its group."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, event, given
from hypothesis import strategies as st

from pipeline.errors import StepError
from tests import reference
from tests.support.cli import cli
from tests.support.samples import build, ranks, sample, write_step
from tests.support.strategies import derandomized

QUARANTINE = {"on_invalid": "quarantine"}
CENTRED = {"grpo_std_normalization": False}  # miles' values centred only, as in SEMANTICS 8
NAN = float("nan")


def _written(out: Path) -> dict[int, float]:
    """Each written row's `rewards` by its `sample_indices` (one leaf per row here)."""
    rows = pl.concat(ranks(out))
    return dict(zip(rows["sample_indices"].to_list(), rows["rewards"].to_list(), strict=True))


def _quarantined(out: Path) -> pl.DataFrame:
    return pl.read_parquet(out / "_quarantine" / "step=1.parquet")


# --- slime: positional groups (the step of 2 prompts x 4) --------------------

SLIME = {
    "trainer": "slime",
    "rollout_batch_size": 2,
    "n_samples_per_prompt": 4,
    "global_batch_size": 4,
    **QUARANTINE,
}


def test_slime_sets_a_prompt_aside_whole_and_keeps_the_other_per_prompt(tmp_path: Path) -> None:
    rewards = [0.0, NAN, 2.0, 3.0, 4.0, 4.0, 8.0, 8.0]
    write_step(tmp_path / "in", [sample(i, reward=r) for i, r in enumerate(rewards)])
    meta = build(tmp_path / "in", tmp_path / "out", **SLIME)
    assert meta["counts"]["quarantined"] == 4
    assert meta["quarantined_rules"] == {"reward_finite": 1, "reward_group_kept_whole": 3}
    q = _quarantined(tmp_path / "out")
    assert q["index"].to_list() == [0, 1, 2, 3]
    mates = q.filter(pl.col("index") != 1)["reason"].to_list()
    assert all(r.startswith("reward_group_kept_whole:") for r in mates)
    assert all("lost row (index 1, leaf 0) to reward_finite" in r for r in mates)
    # the prompt left is normalized as its own group, not the four rows as one batch of 4
    # that happens to be a group too: as slime normalizes it within the step as given
    expected = reference.slime_rewards(
        [sample(i, reward=rewards[i]) for i in range(4, 8)],
        reference.slime_settings({**SLIME, "rollout_batch_size": 1}),
    )[1]
    written = _written(tmp_path / "out")
    assert [written[i] for i in range(4, 8)] == expected
    scaled = 2 / (math.sqrt(16 / 3) + 1e-6)  # the group's centred rewards over its std
    assert expected == pytest.approx([-scaled, -scaled, scaled, scaled], rel=1e-6)


@pytest.mark.parametrize("stream_above", [None, 0])
def test_every_reader_sets_the_same_groups_aside(tmp_path: Path, stream_above: int | None) -> None:
    """The rank-bounded read (stream_above 0) quarantines what the in-memory read does."""
    rewards = [0.0, NAN, 2.0, 3.0, 4.0, 4.0, 8.0, 8.0]
    write_step(tmp_path / "in", [sample(i, reward=r) for i, r in enumerate(rewards)])
    meta = build(tmp_path / "in", tmp_path / "out", **SLIME, stream_above=stream_above)
    assert meta["counts"]["quarantined"] == 4
    assert _quarantined(tmp_path / "out")["index"].to_list() == [0, 1, 2, 3]
    assert sorted(_written(tmp_path / "out")) == [4, 5, 6, 7]


def test_verl_without_group_index_is_refused_not_grouped(tmp_path: Path) -> None:
    rows = [sample(i, reward=NAN if i == 1 else 1.0) for i in range(4)]
    write_step(tmp_path / "in", rows)
    with pytest.raises(StepError, match="group_of_rollout_n"):
        build(tmp_path / "in", tmp_path / "out", train_batch_size=1, **VERL)


def test_slime_three_prompts_keep_their_own_groups_after_one_goes(tmp_path: Path) -> None:
    """12 rows (3 x 4) less one prompt are 8 rows, which slime on its own would normalize as
    one group mixing two prompts: each stays its own group."""
    rewards = [1.0, 2.0, NAN, 4.0] + [0.0, 0.0, 1.0, 1.0] + [10.0, 20.0, 30.0, 50.0]
    write_step(tmp_path / "in", [sample(i, reward=r) for i, r in enumerate(rewards)])
    meta = build(tmp_path / "in", tmp_path / "out", **{**SLIME, "rollout_batch_size": 3})
    assert meta["counts"]["quarantined"] == 4
    written = _written(tmp_path / "out")
    for start in (4, 8):
        group = [sample(i, reward=rewards[i]) for i in range(start, start + 4)]
        alone = reference.slime_settings({**SLIME, "rollout_batch_size": 1})
        assert [written[i] for i in range(start, start + 4)] == reference.slime_rewards(
            group, alone
        )[1]


def test_slime_whole_batch_group_refuses_the_quarantine(tmp_path: Path) -> None:
    rewards = [0.0, NAN, 2.0, 3.0, 4.0, 5.0, 6.0]  # 7 rows: not 2 x 4, one group
    write_step(tmp_path / "in", [sample(i, reward=r) for i, r in enumerate(rewards)])
    with pytest.raises(StepError, match="quarantine_changes_reward_group") as refused:
        build(tmp_path / "in", tmp_path / "out", **SLIME)
    line = refused.value.violations[0].line()
    assert "a batch of 7 rows" in line and "(1, 0)" in line
    assert not (tmp_path / "out" / "step=1").exists()


# --- miles --------------------------------------------------------------------------


def test_miles_without_group_index_sets_the_run_aside_and_keeps_runs(tmp_path: Path) -> None:
    rows = [sample(i, reward=r) for i, r in enumerate([0.0, 2.0, 10.0, 14.0, NAN, 1.0])]
    write_step(tmp_path / "in", rows)
    chosen = {"global_batch_size": 1, "n_samples_per_prompt": 2, "rollout_batch_size": 3, **CENTRED}
    meta = build(tmp_path / "in", tmp_path / "out", **chosen, **QUARANTINE)
    assert meta["counts"]["quarantined"] == 2
    # 4 rows are not 2 x 3: miles on them alone would take one group, [-6.5, -4.5, 3.5, 7.5]
    assert _written(tmp_path / "out") == {0: -1.0, 1: 1.0, 2: -2.0, 3: 2.0}


def test_miles_group_index_sets_the_group_aside(tmp_path: Path) -> None:
    groups, rewards = [0, 1, 0, 1, 2, 2], [0.0, 1.0, NAN, 5.0, 2.0, 4.0]
    rows = [
        sample(i, group_index=g, reward=r)
        for i, (g, r) in enumerate(zip(groups, rewards, strict=True))
    ]
    write_step(tmp_path / "in", rows)
    meta = build(tmp_path / "in", tmp_path / "out", global_batch_size=1, **QUARANTINE, **CENTRED)
    assert _quarantined(tmp_path / "out")["index"].to_list() == [0, 2]
    assert meta["quarantined_rules"] == {"reward_finite": 1, "reward_group_kept_whole": 1}
    assert _written(tmp_path / "out") == {1: -2.0, 3: 2.0, 4: -1.0, 5: 1.0}


def test_miles_whole_batch_group_refuses_the_quarantine(tmp_path: Path) -> None:
    write_step(tmp_path / "in", [sample(i, reward=r) for i, r in enumerate([0.0, NAN, 2.0])])
    with pytest.raises(StepError, match="quarantine_changes_reward_group"):
        build(tmp_path / "in", tmp_path / "out", global_batch_size=1, **QUARANTINE)


def test_without_normalization_only_the_trajectory_goes(tmp_path: Path) -> None:
    write_step(tmp_path / "in", [sample(i, reward=r) for i, r in enumerate([0.0, NAN, 2.0])])
    meta = build(
        tmp_path / "in",
        tmp_path / "out",
        global_batch_size=1,
        advantage_estimator="ppo",
        **QUARANTINE,
    )
    assert meta["counts"]["quarantined"] == 1
    assert _written(tmp_path / "out") == {0: 0.0, 2: 2.0}


@pytest.mark.parametrize(
    ("groups", "kept"),
    [([0, 0, 1, 1, 2, 2], 4), ([0, 0, 0, 1, 1, 1], None)],
)
def test_miles_trim_keeps_groups_or_refuses(
    tmp_path: Path, groups: list[int], kept: int | None
) -> None:
    rows = [sample(i, group_index=g, reward=float(i)) for i, g in enumerate(groups)]
    write_step(tmp_path / "in", rows)
    if kept is None:
        with pytest.raises(StepError, match="trim_cuts_reward_group") as refused:
            build(tmp_path / "in", tmp_path / "out", global_batch_size=4)
        assert "(4, 0), (5, 0)" in refused.value.violations[0].line()
        return
    meta = build(tmp_path / "in", tmp_path / "out", global_batch_size=4, **CENTRED)
    assert meta["counts"]["trimmed"] == 6 - kept
    assert _written(tmp_path / "out") == {0: -0.5, 1: 0.5, 2: -0.5, 3: 0.5}


def test_miles_trim_of_whole_runs_keeps_runs(tmp_path: Path) -> None:
    """6 rows of 3 prompts x 2 trimmed to 4: the two runs left stay groups (miles would
    take the 4 rows, no longer 3 x 2, as one group)."""
    rows = [sample(i, reward=r) for i, r in enumerate([0.0, 2.0, 10.0, 14.0, 3.0, 1.0])]
    write_step(tmp_path / "in", rows)
    chosen = {"global_batch_size": 4, "n_samples_per_prompt": 2, "rollout_batch_size": 3, **CENTRED}
    build(tmp_path / "in", tmp_path / "out", **chosen)
    assert _written(tmp_path / "out") == {0: -1.0, 1: 1.0, 2: -2.0, 3: 2.0}


def test_miles_trim_of_a_whole_batch_group_refuses(tmp_path: Path) -> None:
    write_step(tmp_path / "in", [sample(i, reward=float(i)) for i in range(5)])
    with pytest.raises(StepError, match="trim_cuts_reward_group"):
        build(tmp_path / "in", tmp_path / "out", global_batch_size=4)


# --- verl: GRPO by uid ---------------------------------------------------------------

VERL = {
    "trainer": "verl",
    "rollout_n": 2,
    "max_prompt_length": 8,
    "max_response_length": 8,
    "pad_token_id": 0,
    **QUARANTINE,
}


def _verl_rows() -> list[dict[str, Any]]:
    rewards = [1.0, 3.0, NAN, 0.0, 5.0, 9.0]
    return [sample(i, group_index=i // 2, reward=r) for i, r in enumerate(rewards)]


def test_verl_sets_the_uid_group_aside_and_counts_the_groups_left(tmp_path: Path) -> None:
    write_step(tmp_path / "in", _verl_rows())
    with pytest.raises(StepError, match="train_batch_size_groups"):
        build(tmp_path / "in", tmp_path / "out", train_batch_size=3, **VERL)
    meta = build(tmp_path / "in", tmp_path / "out", train_batch_size=2, **VERL)
    assert meta["quarantined_rules"] == {"reward_finite": 1, "reward_group_kept_whole": 1}
    kept = [row for row in _verl_rows() if row["group_index"] != 1]
    samples = [{"uid": str(r["group_index"]), "scores": [np.float32(r["reward"])]} for r in kept]
    expected = [float(v) for v in reference.verl_grpo(samples, norm_by_std=True)]
    written = _written(tmp_path / "out")
    assert [written[r["index"]] for r in kept] == expected


# --- what a build says ---------------------------------------------------------------


def test_build_says_each_rule_with_its_rows_and_the_quarantine_file(tmp_path: Path) -> None:
    rewards = [0.0, NAN, 2.0, 3.0, 4.0, 4.0, 8.0, 8.0]
    write_step(tmp_path / "in", [sample(i, reward=r) for i, r in enumerate(rewards)])
    out = tmp_path / "out"
    flags = ["--trainer", "slime", "--rollout-batch-size", "2", "--n-samples-per-prompt", "4"]
    done = cli("build", tmp_path / "in", "--out", out, "--global-batch-size", "4",
               "--on-invalid", "quarantine", *flags)  # fmt: skip
    assert done.returncode == 0, done.stderr
    where = out / "_quarantine" / "step=1.parquet"
    assert f"step 1: 1 row quarantined by reward_finite -> {where}" in done.stderr
    assert f"step 1: 3 rows quarantined by reward_group_kept_whole -> {where}" in done.stderr
    assert "4 quarantined (3 rows of reward groups kept whole)" in done.stdout
    manifest = json.loads((out / "step=1" / "manifest.json").read_text())
    assert manifest["quarantined_rules"] == {"reward_finite": 1, "reward_group_kept_whole": 3}


def test_a_refused_quarantine_is_one_line_and_exit_1(tmp_path: Path) -> None:
    write_step(tmp_path / "in", [sample(i, reward=r) for i, r in enumerate([0.0, NAN, 2.0])])
    done = cli("build", tmp_path / "in", "--out", tmp_path / "out", "--global-batch-size", "1",
               "--on-invalid", "quarantine")  # fmt: skip
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "rule quarantine_changes_reward_group" in lines[0]


# --- differential: the groups as given, against tests/reference.py --------------------


@st.composite
def steps(draw: st.DrawFn) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    trainer = draw(st.sampled_from(["miles", "miles", "slime", "verl"]))
    n = draw(st.integers(1, 4)) if trainer != "verl" else draw(st.integers(2, 4))
    prompts = draw(st.integers(1, 5))
    grouped = trainer == "verl" or (trainer == "miles" and draw(st.booleans()))
    rewards = draw(
        st.lists(
            st.sampled_from([0.0, 1.0, 2.0, 0.5, -3.0, 7.25]),
            min_size=n * prompts,
            max_size=n * prompts,
        )
    )
    bad = draw(st.sets(st.integers(0, n * prompts - 1), min_size=1, max_size=2))
    order = list(range(prompts))
    if grouped and trainer == "miles" and draw(st.booleans()):
        order = draw(st.permutations(order))  # group_index need not follow the rows
    rows = []
    for position, reward in enumerate(rewards):
        extra = {"group_index": order[position // n]} if grouped else {}
        rows.append(sample(position, reward=NAN if position in bad else reward, **extra))
    if trainer == "verl":
        chosen = {**VERL, "rollout_n": n, "train_batch_size": prompts}
    else:
        given = draw(st.sampled_from([prompts, prompts + 1]))  # the batch is n x rbs, or not
        chosen = {
            "trainer": trainer,
            "global_batch_size": 1,
            "n_samples_per_prompt": n,
            "rollout_batch_size": given,
            "advantage_estimator": draw(st.sampled_from(["grpo", "reinforce_plus_plus_baseline"])),
            **QUARANTINE,
        }
    return trainer, rows, chosen


def _groups_as_given(
    trainer: str, rows: list[dict[str, Any]], chosen: dict[str, Any]
) -> list[list[int]]:
    if trainer == "verl":
        return reference.prompt_groups(
            rows, {"n_samples_per_prompt": None, "rollout_batch_size": None}
        )
    if trainer == "slime":
        plain = {
            "n_samples_per_prompt": chosen["n_samples_per_prompt"],
            "rollout_batch_size": chosen["rollout_batch_size"],
        }
        return reference.prompt_groups([{**r, "group_index": None} for r in rows], plain)
    return reference.prompt_groups(rows, reference.effective_settings(chosen))


def _reference_rewards(
    trainer: str, group: list[dict[str, Any]], chosen: dict[str, Any]
) -> list[float]:
    """The group's rewards as its trainer normalizes them, the group on its own."""
    if trainer == "verl":
        samples = [{"uid": "g", "scores": [np.float32(r["reward"])]} for r in group]
        return [float(v) for v in reference.verl_grpo(samples, norm_by_std=True)]
    if trainer == "slime":
        alone = reference.slime_settings(
            {**chosen, "rollout_batch_size": 1, "n_samples_per_prompt": len(group)}
        )
        return [float(v) for v in reference.slime_rewards(group, alone)[1]]
    s = reference.effective_settings(chosen)
    raw = [r["reward"] for r in group]
    return reference.post_process_rewards([{**r, "group_index": 0} for r in group], raw, s)[0]


@derandomized(120, HealthCheck.function_scoped_fixture)
@given(steps())
def test_no_remaining_reward_changes_against_the_groups_as_given(
    tmp_path_factory: pytest.TempPathFactory, case: tuple[str, list[dict[str, Any]], dict[str, Any]]
) -> None:
    trainer, rows, chosen = case
    root = tmp_path_factory.mktemp("step")
    write_step(root / "in", rows)
    groups = _groups_as_given(trainer, rows, chosen)
    bad = {i for i, row in enumerate(rows) if math.isnan(row["reward"])}
    touched = [g for g in groups if bad & set(g)]
    fan_out = len(rows) == chosen.get("n_samples_per_prompt", 0) * chosen.get(
        "rollout_batch_size", 0
    )
    grouped = all(row.get("group_index") is not None for row in rows)
    whole = trainer == "slime" and not fan_out or trainer == "miles" and not (grouped or fan_out)
    left = len(groups) - len(touched)
    event(f"{trainer}: {'refused' if bad and whole else 'set aside' if touched else 'valid'}")
    if bad and whole:
        with pytest.raises(StepError, match="quarantine_changes_reward_group"):
            build(root / "in", root / "out", **chosen)
        return
    if left == 0 or (trainer == "verl" and bad):
        # nothing left to build, or verl's count of groups no longer train_batch_size
        with pytest.raises(StepError):
            build(root / "in", root / "out", **chosen)
        if trainer != "verl" or left == 0:
            return
        chosen = {**chosen, "train_batch_size": left}
    meta = build(root / "in", root / "out", **chosen)
    aside = sorted(i for g in touched for i in g)
    assert meta["counts"]["quarantined"] == len(aside)
    if aside:
        assert sorted(_quarantined(root / "out")["index"].to_list()) == aside
    written = _written(root / "out")
    for group in groups:
        if group in touched:
            continue
        expected = _reference_rewards(trainer, [rows[i] for i in group], chosen)
        assert [written[i] for i in group] == expected, (group, expected)

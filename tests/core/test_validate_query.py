"""Validation evaluates each model's rules (schemas/rules.py) in one Polars query (`passes`)
and asks Pandera only when something fails; the light frame's quick list checks settle
exactly. On every case of the schema-rule tests, on valid steps and with the sibling-reward
rule, the one query and Pandera agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest

from pipeline.errors import StepError
from pipeline.io.discovery import find_sources
from pipeline.io.load import group_steps
from pipeline.schemas import validate
from tests.support.rule_cases import CASES
from tests.support.samples import plan, sample, write_step


def _valid_steps() -> list[tuple[list[dict[str, Any]], dict[str, Any]]]:
    v2 = {"session_version": "v2"}
    return [
        ([sample(i, reward=float(i)) for i in range(4)], {}),
        ([sample(0, **v2, rollout_id=7), sample(0, 1, **v2, rollout_id=7), sample(1)], {}),
        ([sample(0), sample(1, reward=float("nan"))], {}),
        (
            [sample(i, group_index=i // 2, reward=float(i)) for i in range(4)],
            {"advantage_estimator": "grpo"},
        ),
    ]


def test_one_query_agrees_with_pandera(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every model call of every case: the one-query verdict equals Pandera's own."""
    fast_passes = validate.passes
    pandera_only = validate._failure_cases
    verdicts: list[tuple[str, bool | None, bool]] = []

    def both(model: Any, frame: pl.DataFrame) -> pl.DataFrame | None:
        cases = pandera_only(model, frame)
        verdicts.append((model.name, fast_passes(model, frame), cases is None))
        return cases

    monkeypatch.setattr(validate, "passes", lambda model, frame: None)
    monkeypatch.setattr(validate, "_failure_cases", both)
    steps = [(rows, {}) for _, rows, _, _ in CASES] + _valid_steps()
    for number, (rows, settings) in enumerate(steps):
        write_step(tmp_path / str(number), rows)
        try:
            plan(tmp_path / str(number), **{"global_batch_size": 1, **settings})
        except StepError:
            pass
    assert verdicts
    assert [(name, fast) for name, fast, _ in verdicts] == [
        (name, pandera) for name, _, pandera in verdicts
    ]
    outcomes = {(name, pandera) for name, _, pandera in verdicts}
    models = ("RolloutSampleTable", "SampleRules")
    assert {(m, ok) for m in models for ok in (True, False)} <= outcomes
    assert ("SiblingRewards", True) in outcomes


def test_log_probs_are_judged_finite_by_their_sums_then_value_by_value(tmp_path: Path) -> None:
    """The quick test (a list's sum is finite) and the exact one (every value is finite)
    agree on every row of `light_frame`, finite values whose float32 sum overflows included."""
    from pipeline import columns as c
    from pipeline.io.load import load_step
    from pipeline.transforms import samples

    nan, inf = float("nan"), float("inf")
    lists = [
        [-0.5, -1.0],
        [-0.5, nan],
        [nan],
        [inf, -1.0],
        [-inf],
        [3e38, 3e38],  # finite values, an infinite float32 sum
        [-3e38, -3e38, 3e38, -3e38],
        [],
        None,
        [None, -1.0],
        [None],
    ]
    rows = [sample(i, rollout_log_probs=value) for i, value in enumerate(lists)]
    ((step, sources),) = group_steps(find_sources([write_step(tmp_path, rows)])).items()
    frame = load_step(step, sources).frame
    assert frame.schema[c.ROLLOUT_LOG_PROBS] == pl.List(pl.Float32)

    light = samples.light_frame(frame, None, step)

    exact = frame.select(samples._log_probs_finite(frame.schema)).to_series()
    assert light.get_column(c.LOG_PROBS_FINITE).to_list() == exact.to_list()
    quick = samples.light_columns(frame.lazy(), None, step).collect()
    assert quick.get_column(c.LOG_PROBS_FINITE)[5:7].to_list() == [False, False]  # settled exactly
    assert exact.to_list() == [True, False, False, False, False, True, True, True, True, True, True]


def test_log_probs_are_judged_finite_at_once_by_the_sum_of_all_their_values(
    tmp_path: Path,
) -> None:
    """`log_probs_all_finite` says yes only where every value is finite, of the rows the
    frame holds (a slice's alone); no where finite values overflow the sum, whose rows the
    per-row test then settles. Either way `light_frame` and `reduced_lists` give each row
    the exact answer."""
    from pipeline import columns as c
    from pipeline.io.load import load_step
    from pipeline.transforms import samples

    nan = float("nan")
    lists = [[nan], [-0.5, -1.0], [], None, [None, -2.0], [3e38, 3e38], [-1.0]]
    rows = [sample(i, rollout_log_probs=value) for i, value in enumerate(lists)]
    ((step, sources),) = group_steps(find_sources([write_step(tmp_path, rows)])).items()
    frame = load_step(step, sources).frame

    def exact(part: pl.DataFrame) -> list[bool]:
        return part.select(samples._log_probs_finite(part.schema)).to_series().to_list()

    for part, at_once in [
        (frame, False),  # a NaN
        (frame.slice(1, 4), True),  # the NaN's row is not in the slice
        (frame.slice(1), False),  # finite, but 3e38 + 3e38 is past the float32 range
        (frame.slice(6), True),
        (frame.drop(c.ROLLOUT_LOG_PROBS), False),  # no log probs to judge
    ]:
        assert samples.log_probs_all_finite(part) is at_once
        light = samples.light_frame(part, None, step).get_column(c.LOG_PROBS_FINITE)
        reduced = samples.reduced_lists(part).get_column(c.LOG_PROBS_FINITE)
        if c.ROLLOUT_LOG_PROBS in part.columns:
            assert light.to_list() == reduced.to_list() == exact(part)
        else:
            assert light.null_count() == reduced.null_count() == part.height


def test_a_loss_mask_is_judged_binary_by_its_least_and_greatest_value(tmp_path: Path) -> None:
    """MASK_BINARY from the list's min and max is what testing each value gives."""
    from pipeline import columns as c
    from pipeline.io.load import load_step
    from pipeline.transforms import samples

    masks = [[0, 1, 1], [0, 2], [-1, 0], [], None, [None, 1], [None], [None, 3], [1] * 50 + [5]]
    rows = [sample(i, loss_mask=mask) for i, mask in enumerate(masks)]
    ((step, sources),) = group_steps(find_sources([write_step(tmp_path, rows)])).items()
    frame = load_step(step, sources).frame
    assert frame.schema[c.LOSS_MASK] == pl.List(pl.Int8)

    light = samples.light_frame(frame, None, step)

    exact = frame.select(pl.col(c.LOSS_MASK).list.eval(pl.element().is_in([0, 1])).list.all())
    assert light.get_column(c.MASK_BINARY).to_list() == exact.to_series().to_list()
    assert exact.to_series().to_list() == [True, False, False, True, None, True, True, False, False]

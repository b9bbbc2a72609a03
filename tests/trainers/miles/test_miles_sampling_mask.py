"""The sampling-support columns against miles at the head of its PR #2595
(`miles_support.SAMPLING_MASK_PIN`, three commits on PIN): `rollout_sampling_mask_ids` and
`rollout_sampling_mask_offsets` (int32, compressed sparse rows: offsets response_length + 1
long, from 0 to the number of ids, strictly increasing) reach `train()` from the built step
as from miles' own conversion, bit for bit; a step where some rows lack them, which miles'
`convert_samples_to_train_data` refuses with a ValueError, and rows whose masks miles'
`Sample.validate` rejects are refused at build time with one line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandera.polars  # noqa: F401  (before miles' stand-ins take pydantic's name)
import pytest

from pipeline.errors import StepError
from pipeline.settings import load_settings
from tests.support import miles as ms
from tests.support.miles_hook import NoAllReduce, both_paths
from tests.support.samples import build, sample, write_step

SETTINGS = {"global_batch_size": 4, "dp_size": 2}


@pytest.fixture(scope="module")
def miles(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    source = ms.head_source(tmp_path_factory.mktemp("miles"), ms.SAMPLING_MASK_PIN)
    with ms.miles_modules(source) as modules:
        assert "rollout_sampling_mask_ids" in modules.types.Sample.__dataclass_fields__
        yield modules


def masked(i: int, response: int, **fields: Any) -> dict[str, Any]:
    """A row whose response tokens have supports of 1..3 ids each."""
    sizes = [1 + (i + t) % 3 for t in range(response)]
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + size)
    ids = [(7 * i + 3 * k) % 50_000 for k in range(offsets[-1])]
    return sample(
        i,
        response_length=response,
        reward=float(i % 3),
        rollout_sampling_mask_ids=ids,
        rollout_sampling_mask_offsets=offsets,
        **fields,
    )


def test_sampling_masks_reach_train_as_from_miles(
    miles: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(miles.data, "GeneralPGUtil", NoAllReduce)
    rows = [masked(i, response=1 + i % 4) for i in range(8)]
    write_step(tmp_path / "in", rows, step=2)
    manifest = build(tmp_path / "in", tmp_path / "out", **SETTINGS)
    assert {"rollout_sampling_mask_ids", "rollout_sampling_mask_offsets"} <= set(
        manifest["present_columns"]
    )
    both_paths(miles, rows, SETTINGS, tmp_path / "out", rollout_id=2)


def _miles_refuses(miles: Any, rows: list[dict[str, Any]]) -> None:
    args = ms.miles_args(load_settings(**SETTINGS).to_dict())
    with pytest.raises((ValueError, AssertionError)):
        ms.rollout_side(miles, args, rows, {"dp_size": 2})


def test_a_step_with_some_rows_without_masks_is_refused_as_miles_does(
    miles: Any, tmp_path: Path
) -> None:
    rows = [masked(i, response=2) for i in range(8)]
    for row in rows[5:]:
        row["rollout_sampling_mask_ids"] = row["rollout_sampling_mask_offsets"] = None
    _miles_refuses(miles, rows)
    write_step(tmp_path / "in", rows)
    with pytest.raises(StepError) as refused:
        build(tmp_path / "in", tmp_path / "out", **SETTINGS)
    text = str(refused.value)
    assert "rollout_sampling_mask_ids_all_or_none" in text and "\n" not in text.strip()
    assert not (tmp_path / "out" / "step=1").exists()


@pytest.mark.parametrize(
    "broken",
    [
        {"rollout_sampling_mask_offsets": [0, 2]},  # one offset short of response_length + 1
        {"rollout_sampling_mask_offsets": [1, 2, 3]},  # not from 0
        {"rollout_sampling_mask_offsets": [0, 2, 2]},  # an empty support
        {"rollout_sampling_mask_offsets": [0, 1, 9]},  # past the ids
    ],
    ids=["length", "start", "empty_support", "end"],
)
def test_masks_miles_rejects_are_refused(
    miles: Any, tmp_path: Path, broken: dict[str, Any]
) -> None:
    rows = [masked(i, response=2) for i in range(8)]
    rows[3].update(broken)
    _miles_refuses(miles, rows)
    write_step(tmp_path / "in", rows)
    with pytest.raises(StepError, match="rollout_sampling_mask_(offsets_length|shape)"):
        build(tmp_path / "in", tmp_path / "out", **SETTINGS)

"""The old string form of `weight_versions` (miles up to 31f1ca9) under
`legacy_weight_versions`, against miles at the head of its PRs #1891/#1892
(`miles_support.SPANS_PIN`), whose `Sample.from_dict` loads such strings as
`legacy_weight_versions` and leaves `weight_versions` empty: with `drop` a dump of strings
reaches `train()` as miles' own conversion of what `from_dict` loads (no `weight_versions`
key), a dump mixing both forms keeps only its spans, the staleness budget sets aside what
miles' buffer drops (nothing for the strings) and the weight_version metrics are miles'
own (none for the strings); with `carry` (the default) the strings stay the versions."""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any

import pandera.polars  # noqa: F401  (before miles' stand-ins take pydantic's name)
import pytest
from rollout_shards_loader.miles import read_rank

from pipeline.settings import load_settings
from tests.support import miles as ms
from tests.support.cli import in_process
from tests.support.miles_buffer import buffer_kept, version_metrics
from tests.support.miles_dump import sample_dict, write_dump
from tests.support.miles_hook import NoAllReduce, both_paths
from tests.support.samples import build

STEP = 7
VERSIONS = ("1", "3", "5", "6", "7", "007", "w3")
CHOSEN = {"global_batch_size": 4, "dp_size": 2}


pytestmark = pytest.mark.usefixtures("no_hook")


@pytest.fixture(scope="module")
def miles(spans_miles: Any) -> Any:
    return spans_miles


def string_dicts(seed: int, n: int = 12, spans_every: int = 0) -> list[dict[str, Any]]:
    """Samples as miles' `Sample.to_dict` at 31f1ca9 writes them: `weight_versions` a list
    of strings (some empty); with `spans_every` k, every k-th sample in the span form
    instead, as miles since #1891 writes it (a dump mixing the two)."""
    rng = random.Random(seed)
    dicts = []
    for i in range(n):
        response = rng.randint(1, 5)
        tokens = list(range(2 + response))
        versions: list[Any] = [rng.choice(VERSIONS) for _ in range(rng.randint(0, 3))]
        if spans_every and i % spans_every == 0:
            versions = [[{"version": rng.choice(VERSIONS), "abs_start": 2, "abs_end": 3}]]
        dicts.append(
            sample_dict(
                index=i,
                group_index=i // 2,
                tokens=tokens,
                response_length=response,
                reward=float(rng.randint(0, 2)),
                weight_versions=versions,
            )
        )
    if not any(d["weight_versions"] for d in dicts):
        dicts[0]["weight_versions"] = ["1"]
    return dicts


def loaded(miles: Any, dicts: list[dict[str, Any]]) -> list[Any]:
    """miles' `Sample.from_dict` of each dict, at SPANS_PIN."""
    return [miles.types.Sample.from_dict(copy.deepcopy(d)) for d in dicts]


def rows_of(dicts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The dicts as rows of the contract (for the settings both paths are given)."""
    return [
        {k: d[k] for k in ("index", "group_index", "tokens", "response_length", "reward")}
        | {"status": "completed"}
        for d in dicts
    ]


@pytest.mark.parametrize("spans_every", [0, 3])
@pytest.mark.parametrize("seed", range(3))
def test_dropped_strings_reach_train_as_miles_loads_them(
    miles: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int, spans_every: int
) -> None:
    monkeypatch.setattr(miles.data, "GeneralPGUtil", NoAllReduce)
    dicts = string_dicts(seed, spans_every=spans_every)
    for one, d in zip(loaded(miles, dicts), dicts, strict=True):
        if d["weight_versions"] and isinstance(d["weight_versions"][0], str):
            assert one.legacy_weight_versions == d["weight_versions"]
            assert one.weight_versions == []
    # miles' rollout side fed the Samples from_dict loads, not rows made anew
    monkeypatch.setattr(ms, "samples", lambda m, rows, with_metadata=False: loaded(m, dicts))
    settings = load_settings(**CHOSEN).to_dict()
    args, config = ms.miles_args(settings), ms.train_parallel_config(settings)
    converted = ms.train_data(miles, args, [], config)
    assert ("weight_versions" in converted) == bool(spans_every)

    write_dump(tmp_path / "in" / f"{STEP}.pt", STEP, dicts, metadata={})
    manifest = build(tmp_path / "in", tmp_path / "out", legacy_weight_versions="drop", **CHOSEN)
    assert manifest["settings"]["legacy_weight_versions"] == "drop"
    assert manifest["ignored_columns"] == ["weight_versions"]
    assert manifest["present_columns"] == (["weight_version_spans"] if spans_every else [])
    # the rank-bounded build drops the column alike, byte for byte
    bounded = build(
        tmp_path / "in",
        tmp_path / "bounded",
        legacy_weight_versions="drop",
        stream_above=0,
        **CHOSEN,
    )
    assert [o["sha256"] for o in bounded["outputs"]] == [o["sha256"] for o in manifest["outputs"]]
    both_paths(miles, rows_of(dicts), CHOSEN, tmp_path / "out", rollout_id=STEP)
    for rank in range(CHOSEN["dp_size"]):
        got = read_rank(tmp_path / "out" / f"step={STEP}", rank)
        if not spans_every:
            assert "weight_versions" not in got
            continue
        want = [converted["weight_versions"][i] for i in got["sample_indices"]]
        assert ms.comparable(got["weight_versions"]) == ms.comparable(want)


def test_carry_keeps_the_strings_and_refuses_a_mixed_step(tmp_path: Path) -> None:
    """The default is 31f1ca9's: the strings are the versions; a dump holding both forms
    is refused, as no commit of miles reads it so."""
    dicts = string_dicts(10)
    write_dump(tmp_path / "in" / f"{STEP}.pt", STEP, dicts, metadata={})
    manifest = build(tmp_path / "in", tmp_path / "out", **CHOSEN)
    assert manifest["settings"]["legacy_weight_versions"] == "carry"
    assert manifest["present_columns"] == ["weight_versions"] and not manifest["ignored_columns"]
    got = read_rank(tmp_path / "out" / f"step={STEP}", 0)
    assert got["weight_versions"] == [dicts[i]["weight_versions"] for i in got["sample_indices"]]
    write_dump(tmp_path / "mixed" / f"{STEP}.pt", STEP, string_dicts(10, spans_every=3), {})
    mixed = ["build", str(tmp_path / "mixed"), "--out", str(tmp_path / "o2"), *flags(CHOSEN)]
    result = in_process(mixed)
    assert result.returncode == 1 and "rule weight_versions_one_form" in result.stderr


def flags(chosen: dict[str, Any]) -> list[str]:
    return [part for k, v in chosen.items() for part in (f"--{k.replace('_', '-')}", str(v))]


def miles_kept(miles: Any, samples: list[Any], budget: int) -> list[int]:
    """The group_index of each group miles' buffer keeps at engine version STEP."""
    groups: dict[int, list[Any]] = {}
    for one in samples:
        groups.setdefault(one.group_index, []).append(one)
    (last,) = loaded(miles, [sample_dict(index=10**6, group_index=10**6)])
    return buffer_kept(miles, groups, last, STEP, budget)[0]


@pytest.mark.parametrize("budget", [0, 2, 5])
def test_the_budget_sets_nothing_aside_for_dropped_strings(
    miles: Any, tmp_path: Path, budget: int
) -> None:
    dicts = string_dicts(20 + budget, n=16)
    samples = loaded(miles, dicts)
    kept = miles_kept(miles, samples, budget)
    assert kept == sorted({d["group_index"] for d in dicts})  # miles drops no group
    write_dump(tmp_path / "in" / f"{STEP}.pt", STEP, dicts, metadata={})
    chosen = {"global_batch_size": 2, "dp_size": 2, "on_invalid": "quarantine"}
    for mode, out in (("drop", "drop"), ("carry", "carry")):
        meta = build(
            tmp_path / "in",
            tmp_path / out,
            max_weight_staleness=budget,
            legacy_weight_versions=mode,
            **chosen,
        )
        stale = meta["stats"]["rollout/fully_async/stale_groups_filtered"]
        if mode == "drop":
            assert meta["counts"]["quarantined"] == 0 and stale == 0
        else:  # 31f1ca9 reads the strings: some group is that stale at every budget here
            assert meta["counts"]["quarantined"] > 0 and stale > 0


@pytest.mark.parametrize("seed", range(4))
def test_weight_version_metrics_are_miles_own_on_dropped_strings(
    miles: Any, tmp_path: Path, seed: int
) -> None:
    dicts = string_dicts(30 + seed, spans_every=seed % 2 * 4)
    write_dump(tmp_path / "in" / f"{STEP}.pt", STEP, dicts, metadata={})
    meta = build(tmp_path / "in", tmp_path / "drop", legacy_weight_versions="drop", **CHOSEN)
    want, ours = version_metrics(miles, loaded(miles, dicts), meta["stats"])
    assert ours == want
    if not seed % 2:  # strings only: miles measures none, 31f1ca9's reading measures them
        carried = build(tmp_path / "in", tmp_path / "carry", **CHOSEN)
        assert not want and "rollout/weight_version/mean" in carried["stats"]
    else:  # the spans of a mixed dump: measured as miles measures them
        assert "weight_version/mean" in want


def test_the_setting_is_a_flag_and_a_usage_error_when_misspelt(tmp_path: Path) -> None:
    dicts = string_dicts(40)
    write_dump(tmp_path / "in" / f"{STEP}.pt", STEP, dicts, metadata={})
    out = tmp_path / "out"
    given = ["build", str(tmp_path / "in"), "--out", str(out), *flags(CHOSEN)]
    result = in_process([*given, "--legacy-weight-versions", "drop"])
    assert result.returncode == 0, result.stderr
    result = in_process([*given, "--legacy-weight-versions", "keep"])
    assert result.returncode == 2 and "legacy-weight-versions" in result.stderr
    assert "\n" not in result.stderr.strip()

"""Weight-version spans against miles at the head of its PRs #1891/#1892
(`miles_support.SPANS_PIN`): a step whose rows hold `weight_version_spans` reaches
`train()` as from miles' own conversion (`weight_versions`: per sample, per call, the
spans' `to_dicts`), bit for bit, over many random steps; the staleness budget sets aside
the groups miles' buffer drops and the weight_version metrics are miles' own, both read
from the spans; a dump miles writes is read as miles' `Sample.from_dict` loads it (an old
dump's strings kept aside as `legacy_weight_versions` reach no trainer); spans miles'
`Sample.validate` rejects, and steps mixing the string and span forms, are refused in one
line."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pandera.polars  # noqa: F401  (before miles' stand-ins take pydantic's name)
import pytest
from rollout_shards_loader.miles import read_rank

from pipeline.errors import StepError
from tests import reference
from tests.support import miles as ms
from tests.support.miles_buffer import buffer_kept, version_metrics
from tests.support.miles_dump import sample_dict, write_dump
from tests.support.miles_hook import NoAllReduce, both_paths
from tests.support.samples import build, sample, write_step

STEP = 7
VERSIONS = ("1", "2", "3", "4", "5", "6", "7", "007", "w3")


pytestmark = pytest.mark.usefixtures("no_hook")


@pytest.fixture(scope="module")
def miles(spans_miles: Any) -> Any:
    return spans_miles


def random_spans(rng: random.Random, n_tokens: int) -> list[list[dict[str, Any]]]:
    """Calls in order, each 0..3 spans, increasing and within the tokens, as miles'
    `from_meta_info` makes them (some calls empty; the versions not always numbers)."""
    cuts = sorted(rng.sample(range(n_tokens + 1), min(n_tokens + 1, 2 * rng.randint(0, 4))))
    pairs = [(cuts[k], cuts[k + 1]) for k in range(0, len(cuts) - 1, 2)]
    calls: list[list[dict[str, Any]]] = []
    while pairs or (len(calls) < 3 and rng.random() < 0.3):
        take = min(len(pairs), rng.randint(0, 3))
        chosen, pairs = pairs[:take], pairs[take:]
        calls.append(
            [{"version": rng.choice(VERSIONS), "abs_start": a, "abs_end": b} for a, b in chosen]
        )
    return calls


def spanned_rows(seed: int, n: int = 12) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        response = rng.randint(1, 6)
        row = sample(i, group_index=i // 2, response_length=response, reward=float(i % 3))
        if rng.random() < 0.8:  # the others hold none (miles' empty list)
            row["weight_version_spans"] = random_spans(rng, len(row["tokens"]))
        rows.append(row)
    if not any(row.get("weight_version_spans") for row in rows):
        rows[0]["weight_version_spans"] = [[{"version": "1", "abs_start": 0, "abs_end": 1}]]
    return rows


SETTINGS = [
    {"global_batch_size": 4, "dp_size": 2},
    {"global_batch_size": 6, "dp_size": 3, "balance_data": True},
    {
        "global_batch_size": 4,
        "dp_size": 2,
        "cp_size": 1,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 24,
    },
]


@pytest.mark.parametrize("seed", range(12))
def test_spans_reach_train_as_from_miles(
    miles: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    monkeypatch.setattr(miles.data, "GeneralPGUtil", NoAllReduce)
    rows = spanned_rows(seed)
    chosen = SETTINGS[seed % len(SETTINGS)]
    write_step(tmp_path / "in", rows, step=STEP)
    manifest = build(tmp_path / "in", tmp_path / "out", **chosen)
    assert manifest["present_columns"] == ["weight_version_spans"]
    both_paths(miles, rows, chosen, tmp_path / "out", rollout_id=STEP)
    # the rank dict as miles' conversion hands it: every row's calls, [] for a row without
    samples = {s.index: s for s in ms.samples(miles, rows)}
    for rank in range(chosen["dp_size"]):
        got = read_rank(tmp_path / "out" / f"step={STEP}", rank)
        want = [
            [call.to_dicts() for call in samples[i].weight_versions] for i in got["sample_indices"]
        ]
        assert ms.comparable(got["weight_versions"]) == ms.comparable(want)


def miles_dropped(miles: Any, rows: list[dict[str, Any]], budget: int) -> list[int]:
    """The group_index of each group miles' buffer drops at engine version STEP."""
    groups: dict[int, list[Any]] = {}
    for row, one in zip(rows, ms.samples(miles, rows), strict=True):
        groups.setdefault(row["group_index"], []).append(one)
    (last,) = ms.samples(miles, [sample(10**6, group_index=10**6)])
    kept, _ = buffer_kept(miles, groups, last, STEP, budget)
    return [g for g in groups if g not in kept]


@pytest.mark.parametrize("budget", [0, 1, 2, 3, 5])
@pytest.mark.parametrize("seed", range(3))
def test_the_budget_reads_spans_as_miles_buffer_does(
    miles: Any, tmp_path: Path, budget: int, seed: int
) -> None:
    rows = spanned_rows(100 + seed, n=16)
    for i in (16, 17):  # a fresh group (version 7 at step 7) that every budget keeps
        spans = [[{"version": "7", "abs_start": 0, "abs_end": 2}]]
        rows.append(sample(i, group_index=8, reward=float(i % 2), weight_version_spans=spans))
    dropped = miles_dropped(miles, rows, budget)
    assert dropped == reference.stale_groups(rows, STEP, budget)
    write_step(tmp_path / "in", rows, step=STEP)
    chosen = {"global_batch_size": 2, "dp_size": 2, "on_invalid": "quarantine"}
    meta = build(tmp_path / "in", tmp_path / "out", max_weight_staleness=budget, **chosen)
    stale = [row for row in rows if row["group_index"] in dropped]
    assert meta["counts"]["quarantined"] == len(stale)
    assert meta["stats"]["rollout/fully_async/stale_groups_filtered"] == len(dropped)
    # the rank-bounded build sets the same groups aside, byte for byte
    bounded = build(
        tmp_path / "in", tmp_path / "bounded", max_weight_staleness=budget, stream_above=0, **chosen
    )
    assert [o["sha256"] for o in bounded["outputs"]] == [o["sha256"] for o in meta["outputs"]]


@pytest.mark.parametrize("seed", range(6))
def test_weight_version_metrics_are_miles_own_on_spans(
    miles: Any, tmp_path: Path, seed: int
) -> None:
    rows = spanned_rows(200 + seed)
    write_step(tmp_path / "in", rows, step=STEP)
    meta = build(tmp_path / "in", tmp_path / "out", global_batch_size=4, dp_size=2)
    want, ours = version_metrics(miles, ms.samples(miles, rows), meta["stats"])
    assert ours == want
    chosen = {"global_batch_size": 4, "dp_size": 2}
    per_sample = reference.reference_metrics(rows, chosen)
    assert {k: per_sample["rollout/" + k] for k in want} == want


def test_a_dump_miles_writes_builds_as_miles_loads_it(
    miles: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sample.to_dict of span Samples, saved as miles saves a dump, then read back by
    Sample.from_dict: the built step's rank dicts are miles' conversion of what it loads."""
    monkeypatch.setattr(miles.data, "GeneralPGUtil", NoAllReduce)
    rows = spanned_rows(300)
    dicts = [s.to_dict() for s in ms.samples(miles, rows)]
    # a sample miles loaded from an old dump keeps its strings aside (#1892) and saves them
    dicts[1]["weight_versions"] = []
    dicts[1]["legacy_weight_versions"] = ["2", "3"]
    for d in dicts:
        d["status"] = d["status"] if isinstance(d["status"], str) else d["status"].value
    loaded = [miles.types.Sample.from_dict(d) for d in dicts]
    assert loaded[1].weight_versions == [] and loaded[1].legacy_weight_versions == ["2", "3"]
    # the rows as miles loads them: row 1 without versions
    rows[1].pop("weight_version_spans", None)
    write_dump(tmp_path / "in" / f"{STEP}.pt", STEP, dicts, metadata={})
    chosen = {"global_batch_size": 4, "dp_size": 2}
    build(tmp_path / "in", tmp_path / "out", **chosen)
    both_paths(miles, rows, chosen, tmp_path / "out", rollout_id=STEP)


def test_an_old_dump_s_strings_are_pin_s_weight_versions(tmp_path: Path) -> None:
    """A dump of the string form (miles up to 31f1ca9) keeps PIN's behaviour by default
    (`legacy_weight_versions: carry`): the strings are `weight_versions`. miles since #1892
    sets them aside as legacy_weight_versions and hands its trainer none: `drop`, tested in
    test_miles_legacy_versions.py."""
    dicts = [sample_dict(index=i, group_index=i, weight_versions=["3", "4"]) for i in range(4)]
    write_dump(tmp_path / "in" / f"{STEP}.pt", STEP, dicts, metadata={})
    manifest = build(tmp_path / "in", tmp_path / "out", global_batch_size=4, dp_size=2)
    assert manifest["present_columns"] == ["weight_versions"]
    got = read_rank(tmp_path / "out" / f"step={STEP}", 0)
    assert got["weight_versions"] == [["3", "4"], ["3", "4"]]


BROKEN = {
    "past_tokens": [[{"version": "1", "abs_start": 0, "abs_end": 99}]],
    "empty_span": [[{"version": "1", "abs_start": 2, "abs_end": 2}]],
    "overlap": [
        [{"version": "1", "abs_start": 0, "abs_end": 3}],
        [{"version": "2", "abs_start": 2, "abs_end": 4}],
    ],
    "empty_version": [[{"version": "", "abs_start": 0, "abs_end": 1}]],
    "null_version": [[{"version": None, "abs_start": 0, "abs_end": 1}]],
    "negative": [[{"version": "1", "abs_start": -1, "abs_end": 1}]],
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_spans_miles_rejects_are_refused(miles: Any, tmp_path: Path, name: str) -> None:
    rows = spanned_rows(400)
    rows[3]["weight_version_spans"] = BROKEN[name]
    (broken,) = ms.samples(miles, [rows[3]])
    with pytest.raises(AssertionError):
        broken.validate()
    write_step(tmp_path / "in", rows, step=STEP)
    with pytest.raises(StepError) as refused:
        build(tmp_path / "in", tmp_path / "out", global_batch_size=4, dp_size=2)
    text = str(refused.value)
    assert "rule weight_version_spans_order" in text and "(3, 0)" in text
    assert "\n" not in text.strip()
    assert not (tmp_path / "out" / f"step={STEP}").exists()


def test_a_step_mixing_strings_and_spans_is_refused(tmp_path: Path) -> None:
    rows = spanned_rows(500)
    for row in rows[:4]:
        row.pop("weight_version_spans", None)
        row["weight_versions"] = ["5"]
    write_step(tmp_path / "in", rows, step=STEP)
    with pytest.raises(StepError) as refused:
        build(tmp_path / "in", tmp_path / "out", global_batch_size=4, dp_size=2)
    text = str(refused.value)
    assert "rule weight_versions_one_form" in text and "\n" not in text.strip()
    assert "rows (index, leaf): (0, 0), (1, 0), (2, 0), (3, 0)" in text
    # a dump mixing them is refused alike
    dicts = [sample_dict(index=i, group_index=i, weight_versions=["3"]) for i in range(3)]
    dicts.append(
        sample_dict(
            index=3,
            group_index=3,
            weight_versions=[[{"version": "3", "abs_start": 0, "abs_end": 1}]],
        )
    )
    write_dump(tmp_path / "dump" / f"{STEP}.pt", STEP, dicts, metadata={})
    with pytest.raises(StepError, match=r"rule weight_versions_one_form: .*\(3, 0\)$"):
        build(tmp_path / "dump", tmp_path / "out2", global_batch_size=4, dp_size=2)


@pytest.mark.parametrize("fmt", ["parquet", "arrow", "jsonl"])
def test_spans_read_from_every_table_format(tmp_path: Path, fmt: str) -> None:
    calls = [[{"version": "3", "abs_start": 2, "abs_end": 3}], []]
    rows = [sample(i, weight_version_spans=calls if i % 2 else None) for i in range(4)]
    write_step(tmp_path / "in", rows, step=2, fmt=fmt)
    manifest = build(tmp_path / "in", tmp_path / "out", global_batch_size=4, dp_size=2)
    assert manifest["present_columns"] == ["weight_version_spans"]
    folder = tmp_path / "out" / "step=2"
    assert read_rank(folder, 1)["weight_versions"] == [calls, calls]
    assert read_rank(folder, 0)["weight_versions"] == [[], []]
    # numpy has no form for the dicts: as_numpy keeps the lists
    assert read_rank(folder, 1, as_numpy=True)["weight_versions"] == [calls, calls]


@pytest.mark.parametrize(
    "span",
    [
        {"version": 3, "abs_start": 2, "abs_end": 3},  # a number where the version's text belongs
        {"version": "3", "abs_start": 2.5, "abs_end": 3},  # not an integer
        {"version": "3", "abs_start": 2, "abs_end": 3, "weight": 1},  # a key miles refuses
    ],
    ids=["number_version", "float_start", "extra_key"],
)
def test_spans_of_other_types_are_never_coerced(tmp_path: Path, span: dict[str, Any]) -> None:
    rows = [sample(0, weight_version_spans=[[{"version": "1", "abs_start": 2, "abs_end": 3}]])]
    rows.append(sample(1, weight_version_spans=[[span]]))
    write_step(tmp_path / "in", rows, step=2, fmt="jsonl")
    with pytest.raises(StepError) as refused:
        build(tmp_path / "in", tmp_path / "out", global_batch_size=2, dp_size=1)
    text = str(refused.value)
    assert "rule column_type: column weight_version_spans" in text and text.endswith("(1, 0)")

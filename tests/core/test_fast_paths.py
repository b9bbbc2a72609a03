"""The fast paths of issue 13 change how a build runs, never what it writes or reports.

- Shards are byte-identical to those of the code before issue 13 (commit 60d0e68): the
  digests below were taken from it on the same generated steps and settings.
- Validation evaluates each Pandera model's checks in one Polars query (`passes`) and asks
  Pandera only when something fails: on every case of the schema-rule tests, on valid
  steps and with the sibling-reward rule, the one query and Pandera agree.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq
import pytest

from pipeline.errors import StepError
from pipeline.io.readers import find_sources, group_steps, sha256_of
from pipeline.schemas import validate
from pipeline.settings import Settings
from pipeline.step.build import build_step
from tests.conftest import plan, sample, write_step
from tests.core.test_schema_rules import CASES

REPO = Path(__file__).resolve().parents[2]
SETTINGS = {
    "strided": {"global_batch_size": 64, "dp_size": 4},
    "balanced": {"global_batch_size": 64, "dp_size": 4, "balance_data": True},
}
# sha256 of rank=0..3 as commit 60d0e68 wrote them (polars 2.1.0).
BEFORE = {
    "compact-strided": [
        "318945f8994e145b251b0cbcfd5cb181f215405b9064d7567751a7e858c5f1b6",
        "f685f4b29183353f91df5b0fb9b3cc605832052befde06c038996c6e25f32260",
        "02d4fa7dfd0a0693264f6def5c7dd6f53561dfdd17aa9ae6f052d01ae9f62ef6",
        "d4b9dea54428a2715e01d086afe021879237022c2298dbf7df15b56e7587d428",
    ],
    "compact-balanced": [
        "7d02fbcceb4f4e684511ea3ebd106b897b2fa9482e99a4c11492f96508e3b6ea",
        "b98a288d71c1805c70c41237b403301022f41b5b199ab33f279240cfa1a09584",
        "00eff8dc6ad7134fe9c7a1ddaa1b226bc129248bb81a8465ec1dd92a9e14e19a",
        "21f0a2ddff0b8a31306806463fd36870343ebd1644a126b1fc41c09dd8a28580",
    ],
    "non-compact-strided": [
        "d92365259e47bb6c2afcd18b98ea975d140529b13201a26a21a8596525bc034c",
        "5159d64cf07cccbbf8ac90e438184ae426c1f9062b2db331913b016f08dcadac",
        "ca54c30fa1c092efb0ebc9d9b643b32784851ed1789602a309275c40889a3feb",
        "e00e94ceb2940c48a532ccb3a7e7774b59f59b0c1057ad0fee0fa03fb2155a5e",
    ],
    "non-compact-balanced": [
        "b639438a70b4113d4ae65ab9f47943afcff67e2ce2d823a4cd5fe0386591fe1c",
        "ff6baeab4fedd145744345ee6bd1b0e678c3893686d860f882c65debea45feea",
        "5f4437be9caebe3652be5586a0e5cf96d8da9a842cbf2c58feb1f39b8093d2e8",
        "89db0b8bd6aebea09bf4a8a81d5bd5edd1d4b33d304d3d8a42656d0d573d6dba",
    ],
}


def _generated(folder: Path, non_compact: bool) -> Path:
    spec = importlib.util.spec_from_file_location("bench_generate", REPO / "bench" / "generate.py")
    assert spec is not None and spec.loader is not None
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    mix = generate.parse_mix(generate.DEFAULT_MIX, non_compact)
    table = generate.generate_step(0, 3000, 400.0, mix, 8, 0.3, 7, True)
    folder.mkdir(parents=True)
    pq.write_table(table, folder / "step=0.parquet")
    return folder


@pytest.mark.parametrize("kind", ["compact", "non-compact"])
def test_shards_are_the_bytes_written_before(tmp_path: Path, kind: str) -> None:
    inputs = _generated(tmp_path / "in", non_compact=kind == "non-compact")
    sources = group_steps(find_sources([inputs]))[0]
    for name, settings in SETTINGS.items():
        manifest = build_step(0, sources, Settings(**settings), tmp_path / name)
        assert [o.path for o in manifest.outputs] == [f"rank={r}.parquet" for r in range(4)]
        assert [o.sha256 for o in manifest.outputs] == BEFORE[f"{kind}-{name}"], name


def test_recorded_hashes_are_those_of_the_files(tmp_path: Path) -> None:
    """The writer hashes the bytes it writes; reading the files back gives the same."""
    write_step(tmp_path / "in", [sample(i, reward=float(i % 2)) for i in range(16)])
    ((step, sources),) = group_steps(find_sources([tmp_path / "in"])).items()
    manifest = build_step(step, sources, Settings(global_batch_size=8, dp_size=2), tmp_path / "o")
    folder = tmp_path / "o" / f"step={step}"
    assert [o.sha256 for o in manifest.outputs] == [
        sha256_of(folder / o.path) for o in manifest.outputs
    ]


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
        verdicts.append((model.__name__, fast_passes(model, frame), cases is None))
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

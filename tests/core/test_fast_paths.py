"""The fast paths of issue 13 change how a build runs, never what it writes or reports.

- Shards are byte-identical to those of the code before issue 13 (commit 60d0e68): the
  digests below were taken from it on the same generated steps and settings.
- Validation evaluates each model's rules (schemas/rules.py) in one Polars query (`passes`) and asks
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
# sha256 of rank=0..3 (polars 2.1.0). The writer changes of issue 13 (hashing while writing,
# one-query validation) were checked byte-identical against commit 60d0e68; these digests
# were taken after issues 10 and 14 changed the shard columns on purpose (train_step per
# SEMANTICS 6.1; step, rank and every optional column in every rank file).
BEFORE = {
    "compact-strided": [
        "1af73db0fbae5e202d7fc320799f406436838f1b2ef5ab3751c874f0570c5e8e",
        "52b7b4b82c6c225482fcc4e5fec3fb79cdbaa16be2a9e1a76864bd5fa31c0cbd",
        "834fdb30dcfa2d93a4ced4c2014038083ddee01f3f27509995f6d20af6485ad3",
        "a28bdbe6b9fbcbe328527fcf8600be9aff0c2747713e274e867c8d735a7931d8",
    ],
    "compact-balanced": [
        "c23fbafb8e89711a073221178137fa76b55ee251dc0a5bc8c0e618aa1662b3ac",
        "9fdf150d257a7ff76669a15890969f5847ce12163c628ddff269e3d456902e13",
        "1bbfada8ec1eea05aa11140ac13e2bcb4ba08abb049e9b6e7b8a1bb9ad976ca6",
        "24e94868824a9d09ddcf35cad7ef64d8119c3e318386a9077ad6da19c6858101",
    ],
    "non-compact-strided": [
        "57d740dc8f1d17cd7bf0a8ab68b479dbbd975d5e6c6188a125f4ca110b106e5e",
        "eb1cba83140ea6a1256a60e527cebe7600c21e7cef7774e3df5a17b913924c45",
        "35c3d3892ef04e358e6ea13e4edb5ddb161ee1e32493097891c39d3078031ba2",
        "40ecd33c7c53500f4695338d790367b95c81fe0f81e2ef5a0343640398fb19a3",
    ],
    "non-compact-balanced": [
        "fb03da70e37b3f0b57dfbeb8ce80769ae12379c7d97e48f1434f95c542e31e86",
        "bf01c18cf7661dcef3899b27c55f4ad335debf966ab231ff5bf0b4fb9cc4087e",
        "b3d62aa13b3f66e22f187aa1b0cad6ea98b5dd20020dae27120455597ce6f04e",
        "9358bf127560088e433be0887913b909efcde3dfe2528c38d75a5f46147d7974",
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
    from pipeline.io.readers import load_step
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


def test_a_loss_mask_is_judged_binary_by_its_least_and_greatest_value(tmp_path: Path) -> None:
    """MASK_BINARY from the list's min and max is what testing each value gives."""
    from pipeline import columns as c
    from pipeline.io.readers import load_step
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

"""`rollout-shards plan`: each rank's load under a grid of layouts, equal to what the build of
each layout writes (the figures recomputed here from its rank files, row by row) for every
trainer; the grid read from comma lists; refused layouts named; nothing written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline import planner
from pipeline.cli import GRID_SETTINGS, grid_argvs, main, parser
from pipeline.transforms.flops import forward_flops, miles_model_shape
from pipeline.transforms.metrics import RANK_TOKENS_MAX_OVER_MEAN
from tests.support.samples import generated_step, write_step
from tests.support.verl import case_rows

SHAPE = {
    "num_layers": 4,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "vocab_size": 1000,
    "ffn_hidden_size": 512,
}
SHAPE_FLAGS = [f"--{k.replace('_', '-')}={v}" for k, v in SHAPE.items()]
MILES = [
    "--global-batch-size=64",
    "--use-dynamic-batch-size",
    "--max-tokens-per-gpu=8192",
    *SHAPE_FLAGS,
]
SLIME = [
    "--trainer=slime",
    "--global-batch-size=64",
    "--rollout-batch-size=8",
    "--n-samples-per-prompt=8",
    "--use-dynamic-batch-size",
    "--max-tokens-per-gpu=8192",
    *SHAPE_FLAGS,
]
VERL = [
    "--trainer=verl",
    "--rollout-n=4",
    "--train-batch-size=3",
    "--max-prompt-length=6",
    "--max-response-length=7",
    "--pad-token-id=0",
]


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generated_step(tmp_path_factory.mktemp("plan") / "rollouts", samples=1200)


@pytest.fixture(scope="module")
def verl_rows(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("plan_verl") / "rollouts"
    write_step(root, case_rows(groups=3, n=4, seed=5), step=1)
    return root


def _plan(capsys: pytest.CaptureFixture[str], args: list[str]) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert main(["plan", *args, "--format=json", "--quiet"]) == 0
    return list(json.loads(capsys.readouterr().out))


def _figures_of(folder: Path, dp_size: int, flops_of: Any) -> list[dict[str, Any]]:
    """Each rank's figures from its rank file, one row at a time (the independent count)."""
    figures = []
    for rank in range(dp_size):
        table = pq.read_table(folder / f"rank={rank}.parquet").to_pylist()
        lengths = [row["total_lengths"] for row in table]
        trained = [row for row in table if row["train_step"] is not None]
        scheduled = any(row["micro_batch"] is not None for row in table)
        cells: dict[tuple[Any, ...], list[int]] = {}
        for row in trained:
            key = (row["train_step"], row["micro_batch"]) if scheduled else (row["train_step"],)
            cells.setdefault(key, []).append(row["total_lengths"])
        flops = flops_of(np.array(lengths, dtype=np.int64)) if flops_of else None
        figures.append(
            {
                "tokens": sum(lengths),
                "sum_squared_lengths": sum(n * n for n in lengths),
                "flops": None if flops is None else float(sum(flops.tolist())),
                "micro_batches": len(cells) if scheduled else None,
                "padding": sum(max(c) * len(c) - sum(c) for c in cells.values()),
                "train_steps": len({row["train_step"] for row in trained}),
                "untrained": len(table) - len(trained),
            }
        )
    return figures


@pytest.mark.parametrize(
    ("trainer", "flags", "grid", "step", "shape"),
    [
        ("miles", MILES, ["--dp-size=2,4", "--cp-size", "1,2"], 0, True),
        ("slime", SLIME, ["--dp-size", "2,4"], 0, True),
        ("verl", VERL, ["--dp-size", "1,2"], 1, False),
    ],
)
def test_the_plan_of_each_layout_is_what_its_build_writes(
    trainer: str,
    flags: list[str],
    grid: list[str],
    step: int,
    shape: bool,
    generated: Path,
    verl_rows: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rollouts = verl_rows if trainer == "verl" else generated
    plans = _plan(capsys, [str(rollouts), *flags, *grid])
    variants, varying = grid_argvs([*flags, *grid])
    assert len(plans) == len(variants) > 1
    for plan, variant in zip(plans, variants, strict=True):
        layout = {
            name: getattr(parser().parse_args(["plan", "x", *variant]), name) for name in varying
        }
        assert plan["step"] == step and plan["layout"] == layout and plan["refused"] is None
        out = tmp_path / "-".join(f"{k}{v}" for k, v in layout.items())
        assert main(["build", str(rollouts), f"--out={out}", "--quiet", *variant]) == 0
        manifest = json.loads((out / f"step={step}" / "manifest.json").read_text())
        dp_size = manifest["settings"]["dp_size"]
        flops_of = None
        if shape:
            from pipeline.settings import load_settings

            model = miles_model_shape(load_settings(**SHAPE, global_batch_size=1))
            if trainer == "slime":
                from pipeline.transforms.flops import slime_model_shape

                model = slime_model_shape(load_settings(**SHAPE, global_batch_size=1))

            def flops_of(lengths: np.ndarray, model: Any = model) -> np.ndarray:
                return forward_flops(lengths, model)

        expected = _figures_of(out / f"step={step}", dp_size, flops_of)
        for got, want in zip(plan["ranks"], expected, strict=True):
            assert got.keys() == want.keys()
            for key, value in want.items():
                close = key == "flops" and value is not None
                assert got[key] == (pytest.approx(value, rel=1e-12) if close else value), key
        assert plan["imbalance"]["tokens"] == pytest.approx(
            manifest["stats"][RANK_TOKENS_MAX_OVER_MEAN], rel=1e-12
        )
        assert set(plan["imbalance"]) == set(planner.MEASURES)


def test_the_grid_is_every_combination_in_the_order_given() -> None:
    variants, varying = grid_argvs(
        ["plan", "in", "--dp-size", "8,16", "--cp-size=1,2", "--trainer", "miles"]
    )
    assert varying == ["dp_size", "cp_size"]
    assert [v[2:] for v in variants] == [
        ["--dp-size", "8", "--cp-size", "1", "--trainer", "miles"],
        ["--dp-size", "8", "--cp-size", "2", "--trainer", "miles"],
        ["--dp-size", "16", "--cp-size", "1", "--trainer", "miles"],
        ["--dp-size", "16", "--cp-size", "2", "--trainer", "miles"],
    ]
    assert set(GRID_SETTINGS) <= set(
        vars(
            parser().parse_args(
                ["plan", "x", *(f"--{n.replace('_', '-')}=2" for n in GRID_SETTINGS)]
            )
        )
    )


def test_the_cli_names_the_plans_measures_as_the_planner_does() -> None:
    (plan,) = [
        a
        for a in parser()._subparsers._group_actions[0].choices.items()  # type: ignore[union-attr]
        if a[0] == "plan"
    ]
    (by,) = [a for a in plan[1]._actions if a.dest == "by"]
    assert tuple(by.choices) == planner.MEASURES


def test_the_table_marks_the_best_layout_and_names_refused_ones(
    generated: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    status = main(
        [
            "plan",
            str(generated),
            *MILES,
            "--cp-size=1",
            "--dp-size=2,4",
            "--global-batch-size",
            "64,4096",
            "--by=tokens",
            "--quiet",
        ]
    )
    out = capsys.readouterr().out
    assert status == 0
    lines = out.splitlines()
    assert lines[0] == "step 0"
    marked = [line for line in lines if line.startswith("*")]
    assert len(marked) == 1
    best = marked[0].split()[1:3]
    assert lines[-1] == f"step 0: best by tokens imbalance: {' '.join(best)}"
    refused = [line for line in lines if "refused:" in line]
    assert [line.split(":")[0].strip() for line in refused] == [
        "dp_size=2 global_batch_size=4096",
        "dp_size=4 global_batch_size=4096",
    ]
    assert all("not enough samples" in line or "rule " in line for line in refused)
    assert not list(tmp_path.iterdir())


def test_a_bad_step_is_one_line_and_status_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.support.samples import sample

    rows = [sample(i, reward=float("nan") if i == 2 else 0.0) for i in range(4)]
    write_step(tmp_path / "in", rows)
    capsys.readouterr()
    assert (
        main(["plan", str(tmp_path / "in"), "--global-batch-size=4", "--dp-size=1,2", "--quiet"])
        == 1
    )
    err = capsys.readouterr().err
    assert err.count("rollout-shards: plan: step 1:") == 1 and "reward_finite" in err

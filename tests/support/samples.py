"""Small sample tables: one row, a table, a step written in any input format, and the step
planned or built in-process; what a build left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl

from pipeline.columns import INPUT_SCHEMA
from pipeline.io.discovery import find_sources
from pipeline.io.load import group_steps
from pipeline.settings import Settings, load_settings
from pipeline.step.build import build_step
from pipeline.step.plan import plan_batch
from pipeline.step.readers.memory import load_samples

REPO = Path(__file__).resolve().parents[2]


def sample(index: int, leaf: int = 0, **fields: Any) -> dict[str, Any]:
    """One sample row: 2 prompt tokens plus `response_length` response tokens."""
    response = fields.pop("response_length", 2)
    row = {
        "index": index,
        "leaf": leaf,
        "status": "completed",
        "tokens": list(range(2 + response)),
        "response_length": response,
        "reward": 0.0,
    }
    row.update(fields)
    return row


def table(rows: list[dict[str, Any]]) -> pl.DataFrame:
    names = list(dict.fromkeys(k for row in rows for k in row))
    data = {name: [row.get(name) for row in rows] for name in names}
    schema = {n: INPUT_SCHEMA[n] for n in names if n in INPUT_SCHEMA}
    frame = pl.DataFrame({n: data[n] for n in schema}, schema=schema, strict=False)
    extra = [pl.Series(n, data[n], strict=False) for n in names if n not in schema]
    return frame.with_columns(extra).select(names)


def write_step(root: Path, rows: list[dict[str, Any]], step: int = 1, fmt: str = "parquet") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    frame = table(rows)
    if fmt == "parquet":
        path = root / f"step={step}.parquet"
        frame.write_parquet(path)
    elif fmt == "arrow":
        path = root / f"step={step}.arrow"
        frame.write_ipc(path)
    else:
        path = root / f"step={step}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def plan(root: Path, **settings: Any):
    """The planned batch of the only step under root."""
    ((step, sources),) = group_steps(find_sources([root])).items()
    config = load_settings(**settings)
    return plan_batch(load_samples(step, sources, config), config)


def build(root: Path, out: Path, **settings: Any) -> dict[str, Any]:
    """Build the only step under root; its manifest as the JSON a user reads."""
    ((step, sources),) = group_steps(find_sources([root])).items()
    return build_step(step, sources, load_settings(**settings), out).to_dict()


def only_refused(out: Path, *steps: int) -> bool:
    """Whether a build wrote nothing under `out` but the records of the steps it refused
    (`_refused/step=<N>.json`; its step locks aside)."""
    if not out.exists():
        return not steps
    left = sorted(str(p.relative_to(out)) for p in out.rglob("*") if ".locks" not in p.parts)
    return left == (
        ["_refused", *(f"_refused/step={s}.json" for s in sorted(steps))] if steps else []
    )


def ranks(out: Path, step: int = 1) -> list[pl.DataFrame]:
    folder = out / f"step={step}"
    return [pl.read_parquet(p) for p in sorted(folder.glob("rank=*.parquet"))]


def dead_pid() -> int:
    """The pid of a process that has just exited (until the system reuses it)."""
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(child.stdout)


def generated_step(folder: Path, samples: int = 3000, non_compact: bool = False) -> Path:
    """`folder` holding a step from bench/generate.py (a fixed seed), written by pyarrow as
    rollout engines write it: one row group, big enough for the split read and for rank
    files of several pages."""
    import importlib.util

    import pyarrow.parquet as pq

    spec = importlib.util.spec_from_file_location("bench_generate", REPO / "bench" / "generate.py")
    assert spec is not None and spec.loader is not None
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    mix = generate.parse_mix(generate.DEFAULT_MIX, non_compact)
    table = generate.generate_step(0, samples, 400.0, mix, 8, 0.3, 7, True)
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / "step=0.parquet")
    return folder


def step_in_three_files(folder: Path) -> Path:
    """`folder/rollouts`, holding step 0 of `generated_step` in three files: Parquet of
    several row groups, Arrow IPC and JSON Lines."""
    import pyarrow.parquet as pq

    table = pl.read_parquet(generated_step(folder / "gen") / "step=0.parquet")
    root = folder / "rollouts" / "step=0"
    root.mkdir(parents=True)
    first, second, third = (table.slice(i * 1000, 1000) for i in range(3))
    pq.write_table(first.to_arrow(), root / "a.parquet", row_group_size=250)
    second.write_ipc(root / "b.arrow")
    third.write_ndjson(root / "c.jsonl")
    return folder / "rollouts"


def build_in_process(inputs: Path, out: Path, settings: dict[str, Any]) -> None:
    """Every step under `inputs`, built in this process into `out` with `settings`."""
    for step, files in group_steps(find_sources([inputs])).items():
        build_step(step, files, Settings(**settings), out)


# Each trainer's profile on a step without rollout ids (verl's groups are whole prompts).
TRAINERS: dict[str, dict[str, Any]] = {
    "miles": {"global_batch_size": 64, "dp_size": 4},
    "slime": {
        "trainer": "slime",
        "global_batch_size": 64,
        "dp_size": 4,
        "rollout_batch_size": 8,
        "n_samples_per_prompt": 8,
    },
    "verl": {
        "trainer": "verl",
        "dp_size": 2,
        "rollout_n": 8,
        "train_batch_size": 375,
        "max_prompt_length": 4096,
        "max_response_length": 8192,
        "pad_token_id": 0,
    },
}


def dropped_rollout_rows() -> list[dict[str, Any]]:
    """A compact step of five rollouts whose schedule (two rollouts a train step) drops
    rollout 3 (rows 7 and 8) from the middle of the batch: rollouts by first appearance
    0, 1 | 2, 4 train, and 3's raw rewards stay in `raw_reward`."""
    ids = [0, 0, 1, 1, 2, 2, 4, 3, 3, 4]
    return [
        sample(
            rid,
            ids[:position].count(rid),
            session_version="v2",
            rollout_id=rid,
            reward=float(rid),
            response_length=1 + position % 3,
        )
        for position, rid in enumerate(ids)
    ]


def trajectory(
    index: int, group: int, leaves: int, rollout_id: int | None, **fields: Any
) -> list[dict[str, Any]]:
    """The rows of one trajectory: `leaves` leaves of rollout `index` in prompt group
    `group`, v2 leaves with `rollout_id` when there are several. A field given as a function
    is called with each leaf in turn, in the order the fields are given."""
    several = leaves > 1
    return [
        sample(
            index,
            leaf,
            group_index=group,
            rollout_id=rollout_id if several else None,
            session_version="v2" if several else None,
            **{name: value(leaf) if callable(value) else value for name, value in fields.items()},
        )
        for leaf in range(leaves)
    ]


def entries(root: Path) -> Iterator[tuple[str, Path]]:
    """Every entry under `root`, links not followed: its path relative to `root`, and it."""
    for parent, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(parent) / name
            yield str(path.relative_to(root)), path

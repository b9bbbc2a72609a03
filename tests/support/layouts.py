"""The inputs and layouts that a reader other than the in-memory one (the spill, tasks) must
build to the in-memory build's bytes: one generated step cut into several kinds of input,
and the settings of each kind of rank layout."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from tests.support.samples import generated_step

LAYOUTS: dict[str, dict[str, object]] = {
    "strided": {"global_batch_size": 64, "dp_size": 4},
    "balanced": {"global_batch_size": 64, "dp_size": 4, "balance_data": True},
    "cp schedule": {
        "global_batch_size": 64,
        "dp_size": 2,
        "cp_size": 2,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 8192,
    },
    "vpp schedule": {
        "global_batch_size": 64,
        "dp_size": 2,
        "cp_size": 1,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 8192,
        "vpp_size": 2,
        "microbatch_group_size_per_vp_stage": 2,
    },
    "no trimming": {"global_batch_size": 96, "dp_size": 4, "disable_rollout_trim_samples": True},
}
THREE_FILES = "three files, one without loss_mask"


def cases(first: str, inputs: list[str], layouts: list[str]) -> list[tuple[str, str]]:
    """Every layout on the input `first`, every other input on the strided layout, and the
    balanced layout (rank order not ascending) on parts of several files."""
    return (
        [(first, name) for name in layouts]
        + [(name, "strided") for name in inputs if name != first]
        + [(THREE_FILES, "balanced")]
    )


def split(step: Path, parts: int) -> list[pl.DataFrame]:
    table = pl.read_parquet(step / "step=0.parquet")
    size = -(-table.height // parts)
    return [table.slice(i * size, size) for i in range(parts)]


def three_files_one_without_loss_mask(folder: Path) -> Path:
    parts = split(generated_step(folder / "gen"), 3)
    root = folder / "rollouts" / "step=0"
    root.mkdir(parents=True)
    parts[1] = parts[1].drop("loss_mask")
    for i, part in enumerate(parts):
        pq.write_table(part.to_arrow(), root / f"part-{i}.parquet", row_group_size=500)
    return folder / "rollouts"


def step_column_files(folder: Path, row_group_size: int | None = None) -> Path:
    """Steps 0 and 1 in one file named without a step: the `step` column says which."""
    table = pl.read_parquet(generated_step(folder / "gen") / "step=0.parquet")
    both = pl.concat([table, table.with_columns(pl.lit(1, dtype=pl.Int64).alias("step"))])
    root = folder / "rollouts"
    root.mkdir()
    both.write_parquet(root / "rollouts.parquet", row_group_size=row_group_size)
    return root


SUFFIXES = {"parquet": "parquet", "ipc": "arrow", "ndjson": "jsonl"}


def mixed_files(folder: Path, formats: tuple[str, ...]) -> Path:
    """The step cut into one part per format, in order: a.<suffix>, b.<suffix>, ..."""
    parts = split(generated_step(folder / "gen"), len(formats))
    root = folder / "rollouts" / "step=0"
    root.mkdir(parents=True)
    for name, part, fmt in zip("abcdefgh", parts, formats, strict=False):
        getattr(part, f"write_{fmt}")(root / f"{name}.{SUFFIXES[fmt]}")
    return folder / "rollouts"

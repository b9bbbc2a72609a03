"""The two sides of a parity check: every shard row of a build, or every row of a
sample-table input as the pipeline reads it."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from pipeline import columns as c
from pipeline.columns import INPUT_POSITION, PATH_STEP, RANK_POSITION
from pipeline.errors import StepError, UsageError, Violation
from pipeline.io.readers import find_sources, group_steps, load_step, read_table
from pipeline.manifest import MANIFEST

PROVENANCE = (c.SOURCE_FILE, c.SOURCE_ROW, PATH_STEP)


def is_build(path: Path) -> bool:
    """An output root (step=<N>/manifest.json folders) or one step folder (manifest.json)."""
    if not path.is_dir():
        return False
    if (path / MANIFEST).is_file():
        return True
    return any(p.is_file() for p in path.glob(f"step=*/{MANIFEST}"))


def _step_folders(path: Path, notes: list[str]) -> list[Path]:
    if (path / MANIFEST).is_file():
        return [path]
    folders = []
    for folder in sorted(path.glob("step=*"), key=str):
        if not folder.is_dir():
            continue
        if (folder / MANIFEST).is_file():
            folders.append(folder)
        else:
            notes.append(f"{folder}: no {MANIFEST} (an incomplete step), not compared")
    return folders


def _manifest_step(folder: Path) -> int:
    manifest = folder / MANIFEST
    try:
        return int(json.loads(manifest.read_text())[c.STEP])
    except (ValueError, KeyError, TypeError) as exc:
        reason = f"not a step manifest ({type(exc).__name__}: {exc})"
        raise StepError(
            [Violation(rule="unreadable_file", message=reason, files=[str(manifest)])]
        ) from exc


def _rank_of(path: Path) -> int:
    return int(path.stem.removeprefix("rank="))


def read_build(path: Path, notes: list[str]) -> pl.DataFrame:
    """Every shard row of a build with its step, rank and position in the rank's file."""
    frames = []
    for folder in _step_folders(path, notes):
        step = _manifest_step(folder)
        for shard in sorted(folder.glob("rank=*.parquet"), key=_rank_of):
            frames.append(
                read_table(shard, step).with_columns(
                    pl.lit(step, dtype=pl.Int64).alias(c.STEP),
                    pl.lit(_rank_of(shard), dtype=pl.Int32).alias(c.RANK),
                    pl.int_range(pl.len(), dtype=pl.Int64).alias(RANK_POSITION),
                )
            )
    if not frames:
        raise UsageError(f"{path}: no shard files in its step folders")
    return pl.concat(frames, how="diagonal_relaxed")


def read_inputs(path: Path, notes: list[str]) -> tuple[pl.DataFrame, list[str]]:
    """Every row of a sample-table input as the pipeline reads it (typed to the contract),
    with its position in its step's batch order; and the columns the reader ignores."""
    found: list[str] = []
    steps = group_steps(find_sources([path], notes=found))
    notes.extend(f"{path}: {note}" for note in found)
    if not steps:
        raise UsageError(f"no rollout tables or builds found under {path}")
    frames, ignored = [], set()
    for step, sources in steps.items():
        loaded = load_step(step, sources)
        ignored.update(loaded.ignored_columns)
        frames.append(
            loaded.frame.drop(PROVENANCE, strict=False).with_columns(
                pl.int_range(pl.len(), dtype=pl.Int64).alias(INPUT_POSITION)
            )
        )
    return pl.concat(frames, how="diagonal_relaxed"), sorted(ignored)

"""The two sides of a parity check: every shard row of a build, or every row of a
sample-table input as the pipeline reads it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl

from pipeline import columns as c
from pipeline.columns import INPUT_POSITION, PATH_STEP, RANK_POSITION
from pipeline.errors import StepError, UsageError, Violation, first_line
from pipeline.io.discovery import find_sources
from pipeline.io.load import group_steps, load_step, read_table
from pipeline.io.regular import read_regular
from pipeline.manifest import MANIFEST

PROVENANCE = (c.SOURCE_FILE, c.SOURCE_ROW, PATH_STEP)
INT64 = range(-(2**63), 2**63)
INT32_MAX = 2**31 - 1
_SHARD_NAME = re.compile(r"^rank=(0|[1-9][0-9]*)\.parquet$")


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
    """The step a committed folder's manifest names: an integer within int64, never a float
    rounded (`1e400` reads as infinity) or a string parsed."""
    manifest = folder / MANIFEST
    try:
        step = json.loads(read_regular(manifest).decode())[c.STEP]
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        reason = f"not a step manifest ({type(exc).__name__}: {first_line(exc)})"
        raise StepError(
            [Violation(rule="unreadable_file", message=reason, files=[str(manifest)])]
        ) from None
    if isinstance(step, bool) or not isinstance(step, int) or step not in INT64:
        reason = f"not a step manifest: its step {_shown(step)} is not an int64 step number"
        raise StepError([Violation(rule="unreadable_file", message=reason, files=[str(manifest)])])
    return step


def _shown(value: object) -> str:
    text = json.dumps(value) if isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _shards(folder: Path, step: int) -> list[tuple[int, Path]]:
    """The folder's rank files by rank. A build writes `rank=<K>.parquet` with K an int32
    rank; any other file named like one (a copy, a rank beyond int32) is refused rather
    than compared, since it is not part of the build."""
    shards = []
    for path in folder.glob("rank=*.parquet"):
        if not path.is_file():
            continue
        match = _SHARD_NAME.match(path.name)
        rank = int(match.group(1)) if match else None
        if rank is None or rank > INT32_MAX:
            why = "a rank beyond int32" if rank is not None else "not a shard name"
            message = (
                f"{why}: a build writes rank=<K>.parquet with K from 0 to {INT32_MAX}; "
                "move the file out of the step folder to compare the build"
            )
            raise StepError([Violation("unexpected_shard", message, step=step, files=[str(path)])])
        shards.append((rank, path))
    return sorted(shards)


def read_build(path: Path, notes: list[str]) -> pl.DataFrame:
    """Every shard row of a build with its step, rank and position in the rank's file."""
    frames = []
    for folder in _step_folders(path, notes):
        step = _manifest_step(folder)
        for rank, shard in _shards(folder, step):
            frames.append(
                read_table(shard, step).with_columns(
                    pl.lit(step, dtype=pl.Int64).alias(c.STEP),
                    pl.lit(rank, dtype=pl.Int32).alias(c.RANK),
                    pl.int_range(pl.len(), dtype=pl.Int64).alias(RANK_POSITION),
                )
            )
    if not frames:
        raise UsageError(f"{path}: no shard files in its step folders")
    return pl.concat(frames, how="diagonal_relaxed")


def read_inputs(path: Path | str, notes: list[str]) -> tuple[list[pl.DataFrame], list[str]]:
    """Every row of a sample-table input as the pipeline reads it (typed to the contract),
    with its position in its step's batch order, a frame per step; and the columns the
    reader ignores."""
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
    return frames, sorted(ignored)


def _as_json(name: str) -> pl.Expr:
    """A column's values as JSON text: one type for values whose types differ by step."""
    value = pl.struct(pl.col(name).alias("v")).struct.json_encode()
    return value.str.slice(5).str.head(-1).alias(name)


def one_table(sides: list[list[pl.DataFrame]], notes: list[str]) -> list[pl.DataFrame]:
    """Each side's steps as one table. A column whose type differs between steps (a float
    reward in one, a struct of scores in another) has no common type that keeps every
    value as it is, so it is compared as JSON text on both sides, and a note says so."""
    types: dict[str, set[str]] = {}
    for frames in sides:
        for frame in frames:
            for name, dtype in frame.schema.items():
                types.setdefault(name, set()).add(str(dtype))
    mixed = sorted(name for name, seen in types.items() if len(seen) > 1)
    if mixed:
        notes.append(
            "compared as JSON text, their types differing between steps: "
            + "; ".join(f"{name} ({', '.join(sorted(types[name]))})" for name in mixed)
        )
    return [
        pl.concat(
            [f.with_columns(_as_json(n) for n in mixed if n in f.columns) for f in frames],
            how="diagonal_relaxed",
        )
        for frames in sides
    ]

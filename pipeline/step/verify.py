"""What the blocking asset checks verify, as plain functions over a step folder.

`write_shards` runs them on the staged folder before it is renamed into place, so a step
that a blocking check would reject is never published; the Dagster checks run the same
functions on the committed folder. Each returns the problems found, as (what, problem).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

import polars as pl

from pipeline import columns as c
from pipeline.errors import StepError, Violation, first_line
from pipeline.io import writer
from pipeline.io.checksums import sha256_of
from pipeline.manifest import Manifest
from pipeline.speed import thread_pool, write_threads

ROWS_SHOWN = 10
SPLIT_STEPS = "train_steps"

Problems = list[tuple[str, str]]


def rank_files(manifest: Manifest) -> list[str]:
    return [writer.rank_file(rank) for rank in range(manifest.dp_size)]


def rows_in_rank_files(manifest: Manifest) -> int:
    return sum(output.rows for output in manifest.rank_outputs())


def count_problems(manifest: Manifest) -> Problems:
    """Every ingested row is accounted for, and the rank files together hold the written rows."""
    n = manifest.counts
    accounted = n.quarantined + n.trimmed + n.dropped + n.written
    problems = []
    if accounted != n.ingested:
        problems.append(("counts", f"{n.ingested} ingested but {accounted} accounted for"))
    in_ranks = rows_in_rank_files(manifest)
    if in_ranks != n.written:
        problems.append(("counts", f"{n.written} written but the rank files hold {in_ranks}"))
    return problems


def footer_rows(path: Path | IO[bytes]) -> int | str:
    """The row count in a Parquet file's footer (Polars reads no data page for it), or
    why the file does not read as Parquet (a file, or its bytes held for an object store)."""
    try:
        count: int = pl.scan_parquet(path).select(pl.len()).collect().item()
    except Exception as exc:  # noqa: BLE001 - any read failure means a bad file
        return f"does not read as Parquet: {first_line(exc)}"
    return count


def rank_file_problems(
    manifest: Manifest,
    folder: Path,
    hash_files: bool = True,
    footers: Mapping[str, int | str] | None = None,
) -> Problems:
    """A rank file for every data-parallel rank, readable as Parquet, with the sha256 and
    row count the manifest recorded for it (the sha256 not read again with `hash_files`
    off: the writer computed it from the bytes it wrote; `footers`, what `footer_rows`
    gave for files the writer read back already)."""
    recorded = {output.path: output for output in manifest.outputs}
    names = rank_files(manifest)
    present = [name for name in names if name in recorded and (folder / name).is_file()]
    digests = sha256_of_files(folder, present) if hash_files else {}
    problems = []
    for name in names:
        path = folder / name
        if name not in recorded:
            problems.append((name, "not in the manifest"))
        elif name not in present:
            problems.append((name, "missing"))
        elif hash_files and digests[name] != recorded[name].sha256:
            problems.append((name, "sha256 differs from the manifest"))
        else:
            count = footers[name] if footers and name in footers else footer_rows(path)
            if isinstance(count, str):
                problems.append((name, count))
            elif count != recorded[name].rows:
                problems.append((name, f"{count} rows, manifest says {recorded[name].rows}"))
    return problems


def sha256_of_files(folder: Path, names: Sequence[str]) -> dict[str, str]:
    """The sha256 of each named file of `folder`, by name: hashed on the threads that seal
    written files (`speed.write_threads`), as hashlib lets go of the GIL while it hashes."""
    with thread_pool(max(1, write_threads()[1])) as pool:
        return dict(zip(names, pool.map(lambda name: sha256_of(folder / name), names), strict=True))


def split_rollouts(manifest: Manifest, folder: Path) -> pl.DataFrame:
    """Rollouts (`rollout_ids`) whose trained rows sit in more than one train step, with
    those steps; rows the trainer never trains (null `train_step`) do not count."""
    paths = [folder / name for name in rank_files(manifest)]
    return split_rollouts_of(pl.scan_parquet(paths))


def split_rollouts_of(rank_rows: pl.LazyFrame) -> pl.DataFrame:
    """`split_rollouts` of the rank files' rows, wherever they are read from."""
    return (
        rank_rows.select(c.ROLLOUT_IDS, c.TRAIN_STEP)
        .drop_nulls(c.TRAIN_STEP)
        .group_by(c.ROLLOUT_IDS)
        .agg(pl.col(c.TRAIN_STEP).unique().sort().alias(SPLIT_STEPS))
        .filter(pl.col(SPLIT_STEPS).list.len() > 1)
        .sort(c.ROLLOUT_IDS)
        .collect()
    )


def split_rollout_problems(manifest: Manifest, folder: Path) -> Problems:
    return _split_problems(split_rollouts(manifest, folder))


def _split_problems(split: pl.DataFrame) -> Problems:
    shown = split.head(ROWS_SHOWN)
    return [
        (f"rollout {rollout}", f"in train steps {steps}")
        for rollout, steps in zip(
            shown.get_column(c.ROLLOUT_IDS).to_list(),
            shown.get_column(SPLIT_STEPS).to_list(),
            strict=True,
        )
    ]


def blocking_problems(
    manifest: Manifest,
    folder: Path,
    hash_files: bool = True,
    footers: Mapping[str, int | str] | None = None,
) -> Problems:
    """Everything a blocking check of `training_shards` would reject in `folder`. A rollout
    split across train steps is one only with the rollout-side schedule, which promises to
    keep rollouts whole; without it the trainer splits them too (SEMANTICS 6.1)."""
    problems = count_problems(manifest) + rank_file_problems(manifest, folder, hash_files, footers)
    if not problems and manifest.settings.get("cp_size") is not None:
        problems += split_rollout_problems(manifest, folder)
    return problems


def written_problems(
    manifest: Manifest, footers: Mapping[str, int | str], rank_rows: Sequence[pl.LazyFrame]
) -> Problems:
    """`blocking_problems` of a step whose files are held as bytes (an object-store write,
    `step.store_commit`): `footers` of every written rank file, `rank_rows` their rows."""
    recorded = {output.path: output for output in manifest.outputs}
    problems = count_problems(manifest)
    for name in rank_files(manifest):
        count = footers.get(name, "missing")
        if name not in recorded:
            problems.append((name, "not in the manifest"))
        elif isinstance(count, str):
            problems.append((name, count))
        elif count != recorded[name].rows:
            problems.append((name, f"{count} rows, manifest says {recorded[name].rows}"))
    if not problems and manifest.settings.get("cp_size") is not None:
        problems += _split_problems(split_rollouts_of(pl.concat(rank_rows)))
    return problems


def refuse_unverified(problems: Sequence[tuple[str, str]], step: int) -> None:
    """Refuse, before it is published, a written step that fails a blocking check."""
    if problems:
        raise StepError(
            [
                Violation(
                    rule="shards_verified",
                    message="the written step fails a blocking check and is not published: "
                    + "; ".join(f"{what}: {problem}" for what, problem in problems),
                    step=step,
                )
            ]
        )

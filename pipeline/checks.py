"""Asset checks on `training_shards`: what was written is what the manifest says.

Each check reads the committed step folder of its partition (`context.partition_key`), not
the asset's value, so checking one step never loads another.
"""

import warnings
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl
import pyarrow.parquet as pq

from pipeline import columns as c
from pipeline.assets.reporting import markdown_table
from pipeline.assets.training_shards import training_shards
from pipeline.build import REASON, read_manifest
from pipeline.io import writer
from pipeline.io.readers import sha256_of
from pipeline.partitions import rollout_steps, step_of
from pipeline.resources import RolloutStorage

# Partitioned asset checks are a preview feature of dagster 1.13; they are what lets the
# UI show a check result per step rather than only the latest step's.
warnings.filterwarnings(
    "ignore",
    message="Specifying a partitions_def on an AssetCheckSpec",
    category=dg.PreviewWarning,
)

ROWS_SHOWN = 10


def _manifest(
    context: dg.AssetCheckExecutionContext, storage: RolloutStorage
) -> tuple[int, Path, dict[str, Any] | None]:
    step = step_of(context.partition_key)
    return step, storage.step_folder(step), read_manifest(storage.output_path, step)


def _no_manifest(folder: Path) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        passed=False, description=f"{folder / writer.MANIFEST} is missing or unreadable"
    )


def _table(key: str, header: list[str], rows: list[tuple]) -> dict[str, dg.MetadataValue]:
    """A Markdown table under `key`, or nothing when there are no rows to show."""
    return {key: dg.MetadataValue.md(markdown_table(header, rows))} if rows else {}


def _rank_files(manifest: dict[str, Any]) -> list[str]:
    return [writer.rank_file(rank) for rank in range(manifest["settings"]["dp_size"])]


@dg.asset_check(asset=training_shards, partitions_def=rollout_steps, blocking=True)
def manifest_counts_add_up(
    context: dg.AssetCheckExecutionContext, rollout_storage: RolloutStorage
) -> dg.AssetCheckResult:
    """Every ingested row is accounted for (ingested = quarantined + trimmed + dropped +
    written), and the rank files together hold the written rows."""
    _, folder, manifest = _manifest(context, rollout_storage)
    if manifest is None:
        return _no_manifest(folder)
    n = manifest["counts"]
    accounted = n["quarantined"] + n["trimmed"] + n["dropped"] + n["written"]
    in_ranks = sum(o["rows"] for o in manifest["outputs"] if o["path"] != writer.QUARANTINE)
    problems = []
    if accounted != n["ingested"]:
        problems.append(f"{n['ingested']} ingested but {accounted} accounted for")
    if in_ranks != n["written"]:
        problems.append(f"{n['written']} written but the rank files hold {in_ranks}")
    return dg.AssetCheckResult(
        passed=not problems,
        description="; ".join(problems) or None,
        metadata={**n, "rows_in_rank_files": in_ranks},
    )


@dg.asset_check(asset=training_shards, partitions_def=rollout_steps, blocking=True)
def rank_files_match_manifest(
    context: dg.AssetCheckExecutionContext, rollout_storage: RolloutStorage
) -> dg.AssetCheckResult:
    """A rank file exists for every data-parallel rank, reads as Parquet, and matches the
    sha256 and row count the manifest recorded for it."""
    _, folder, manifest = _manifest(context, rollout_storage)
    if manifest is None:
        return _no_manifest(folder)
    recorded = {o["path"]: o for o in manifest["outputs"]}
    rows = []
    for name in _rank_files(manifest):
        path = folder / name
        if name not in recorded:
            rows.append((name, "not in the manifest"))
        elif not path.is_file():
            rows.append((name, "missing"))
        elif sha256_of(path) != recorded[name]["sha256"]:
            rows.append((name, "sha256 differs from the manifest"))
        else:
            try:
                count = pq.ParquetFile(path).metadata.num_rows
            except Exception as exc:  # noqa: BLE001 - any read failure means a bad file
                rows.append((name, f"does not read as Parquet: {exc}"))
                continue
            if count != recorded[name]["rows"]:
                rows.append((name, f"{count} rows, manifest says {recorded[name]['rows']}"))
    return dg.AssetCheckResult(
        passed=not rows,
        description=f"{len(rows)} rank file(s) do not match the manifest" if rows else None,
        metadata={
            "rank_files": len(_rank_files(manifest)),
            **_table("problems", ["file", "problem"], rows),
        },
    )


@dg.asset_check(asset=training_shards, partitions_def=rollout_steps, blocking=True)
def rollouts_stay_in_one_train_step(
    context: dg.AssetCheckExecutionContext, rollout_storage: RolloutStorage
) -> dg.AssetCheckResult:
    """All rows of one rollout (`rollout_ids`) sit in one train step, across every rank,
    so the loss counts the rollout once in one optimizer step."""
    _, folder, manifest = _manifest(context, rollout_storage)
    if manifest is None:
        return _no_manifest(folder)
    paths = [folder / name for name in _rank_files(manifest)]
    try:
        split = (
            pl.scan_parquet(paths)
            .group_by(c.ROLLOUT_IDS)
            .agg(pl.col(c.TRAIN_STEP).unique().sort().alias("train_steps"))
            .filter(pl.col("train_steps").list.len() > 1)
            .sort(c.ROLLOUT_IDS)
            .collect()
        )
    except (OSError, pl.exceptions.PolarsError) as exc:
        return dg.AssetCheckResult(
            passed=False, description=f"cannot read the rank files: {str(exc).splitlines()[0]}"
        )
    shown = [
        (r[c.ROLLOUT_IDS], r["train_steps"]) for r in split.head(ROWS_SHOWN).iter_rows(named=True)
    ]
    return dg.AssetCheckResult(
        passed=split.height == 0,
        description=f"{split.height} rollout(s) span train steps" if split.height else None,
        metadata={
            "split_rollouts": split.height,
            **_table("first_split_rollouts", [c.ROLLOUT_IDS, "train steps"], shown),
        },
    )


@dg.asset_check(asset=training_shards, partitions_def=rollout_steps)
def no_rows_quarantined(
    context: dg.AssetCheckExecutionContext, rollout_storage: RolloutStorage
) -> dg.AssetCheckResult:
    """Warns when `on_invalid: quarantine` set trajectories aside: how many rows, and why.
    The shards are usable; the quarantined rows are in `quarantine.parquet`."""
    _, folder, manifest = _manifest(context, rollout_storage)
    if manifest is None:
        return _no_manifest(folder)
    quarantined = manifest["counts"]["quarantined"]
    reasons: list[tuple[str, int]] = []
    if quarantined and (folder / writer.QUARANTINE).is_file():
        reasons = (
            pl.read_parquet(folder / writer.QUARANTINE, columns=[REASON])
            .group_by(REASON)
            .len()
            .sort("len", descending=True)
            .rows()
        )
    return dg.AssetCheckResult(
        passed=quarantined == 0,
        severity=dg.AssetCheckSeverity.WARN,
        description=f"{quarantined} rows quarantined" if quarantined else None,
        metadata={
            "quarantined": quarantined,
            **_table("reasons", ["reason", "rows"], reasons),
        },
    )

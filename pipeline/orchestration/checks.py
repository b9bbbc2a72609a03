"""Asset checks on `training_shards`: what was written is what the manifest says.

Each check reads the committed step folder of its partition, not the asset's value, so
checking one step never loads another. They are check specs of the step's own op
(`rollout_step`), evaluated right after the step is committed, or alone ("Execute checks"
in the UI) on a step built before: as separate Dagster steps, a refused step would leave
each of them "Not executing", a red row per check in the run's log under the real cause.
"""

import inspect
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import dagster as dg
import polars as pl

from pipeline.assets.training_shards import training_shards
from pipeline.columns import REASON
from pipeline.io import writer
from pipeline.manifest import MANIFEST, Manifest
from pipeline.orchestration.partitions import rollout_steps, step_of
from pipeline.orchestration.reporting import (
    ROLLOUT_SAMPLES_KEY,
    STEP_KEEPS_EVERY_RULE,
    markdown_table,
)
from pipeline.orchestration.resources import RolloutStorage
from pipeline.step import refused, verify

# Partitioned asset checks are a preview feature of dagster 1.13; they are what lets the
# UI show a check result per step rather than only the latest step's.
warnings.filterwarnings(
    "ignore",
    message="Specifying a partitions_def on an AssetCheckSpec",
    category=dg.PreviewWarning,
)


def _manifest(partition_key: str, storage: RolloutStorage) -> tuple[Path, Manifest | None]:
    return storage.committed_step(step_of(partition_key))


def _no_manifest(folder: Path) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        passed=False, description=f"{folder / MANIFEST} is missing or unreadable"
    )


def _table(key: str, header: list[str], rows: list[tuple]) -> dict[str, dg.MetadataValue]:
    """A Markdown table under `key`, or nothing when there are no rows to show."""
    return {key: dg.MetadataValue.md(markdown_table(header, rows))} if rows else {}


def manifest_counts_add_up(
    partition_key: str, rollout_storage: RolloutStorage
) -> dg.AssetCheckResult:
    """Every ingested row is accounted for (ingested = quarantined + trimmed + dropped +
    written), and the rank files together hold the written rows."""
    folder, manifest = _manifest(partition_key, rollout_storage)
    if manifest is None:
        return _no_manifest(folder)
    problems = verify.count_problems(manifest)
    return dg.AssetCheckResult(
        passed=not problems,
        description="; ".join(problem for _, problem in problems) or None,
        metadata={
            **manifest.counts.to_dict(),
            "rows_in_rank_files": verify.rows_in_rank_files(manifest),
        },
    )


def rank_files_match_manifest(
    partition_key: str, rollout_storage: RolloutStorage
) -> dg.AssetCheckResult:
    """A rank file exists for every data-parallel rank, reads as Parquet, and matches the
    sha256 and row count the manifest recorded for it."""
    folder, manifest = _manifest(partition_key, rollout_storage)
    if manifest is None:
        return _no_manifest(folder)
    rows = verify.rank_file_problems(manifest, folder)
    return dg.AssetCheckResult(
        passed=not rows,
        description=f"{len(rows)} rank file(s) do not match the manifest" if rows else None,
        metadata={
            "rank_files": len(verify.rank_files(manifest)),
            **_table("problems", ["file", "problem"], rows),
        },
    )


def rollouts_stay_in_one_train_step(
    partition_key: str, rollout_storage: RolloutStorage
) -> dg.AssetCheckResult:
    """With the rollout-side schedule (`cp_size` set), all trained rows of one rollout
    (`rollout_ids`) sit in one train step across every rank, so the loss counts the rollout
    once in one optimizer step. Without it the trainer itself can split a rollout across
    steps (SEMANTICS 6.1): the split rollouts are counted, and the check passes."""
    folder, manifest = _manifest(partition_key, rollout_storage)
    if manifest is None:
        return _no_manifest(folder)
    try:
        split = verify.split_rollouts(manifest, folder)
    except (OSError, pl.exceptions.PolarsError) as exc:
        return dg.AssetCheckResult(
            passed=False, description=f"cannot read the rank files: {str(exc).splitlines()[0]}"
        )
    scheduled = manifest.settings.get("cp_size") is not None
    shown = verify.split_rollout_problems(manifest, folder) if split.height else []
    return dg.AssetCheckResult(
        passed=split.height == 0 or not scheduled,
        description=f"{split.height} rollout(s) span train steps" if split.height else None,
        metadata={
            "split_rollouts": split.height,
            "scheduled": scheduled,
            **_table("first_split_rollouts", ["rollout", "train steps"], shown),
        },
    )


def every_row_is_trained(
    partition_key: str, rollout_storage: RolloutStorage
) -> dg.AssetCheckResult:
    """Warns when the trainer will never train some written rows (`train_step` null): the
    rows past a rank's last whole step of global_batch_size // dp_size rows (SEMANTICS
    6.1). The rollout-side schedule (`cp_size`) or trimming would train them."""
    folder, manifest = _manifest(partition_key, rollout_storage)
    if manifest is None:
        return _no_manifest(folder)
    untrained = manifest.counts.untrained
    return dg.AssetCheckResult(
        passed=untrained == 0,
        severity=dg.AssetCheckSeverity.WARN,
        description=(
            f"{untrained} rows on ranks {manifest.untrained_ranks} are never trained; the "
            "rollout-side schedule (cp_size) or trimming would train them"
            if untrained
            else None
        ),
        metadata={"untrained": untrained, "untrained_ranks": str(manifest.untrained_ranks)},
    )


def no_rows_quarantined(partition_key: str, rollout_storage: RolloutStorage) -> dg.AssetCheckResult:
    """Warns when `on_invalid: quarantine` set trajectories aside: how many rows, and why.
    The shards are usable; the quarantined rows are in `_quarantine/step=<N>.parquet`."""
    folder, manifest = _manifest(partition_key, rollout_storage)
    if manifest is None:
        return _no_manifest(folder)
    quarantined = manifest.counts.quarantined
    reasons: list[tuple[str, int]] = []
    set_aside = writer.quarantine_path(folder.parent, manifest.step)
    if quarantined and set_aside.is_file():
        reasons = (
            pl.read_parquet(set_aside, columns=[REASON])
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


ShardCheck = Callable[[str, RolloutStorage], dg.AssetCheckResult]

# Blocking: a failure fails the run (the published step does not match its manifest);
# the others warn (the shards are usable).
_CHECKS: list[tuple[ShardCheck, bool]] = [
    (manifest_counts_add_up, True),
    (rank_files_match_manifest, True),
    (rollouts_stay_in_one_train_step, True),
    (no_rows_quarantined, False),
    (every_row_is_trained, False),
]

SHARD_CHECKS: list[tuple[dg.AssetCheckSpec, ShardCheck]] = [
    (
        dg.AssetCheckSpec(
            check.__name__,
            asset=training_shards.key,
            blocking=blocking,
            partitions_def=rollout_steps,
            description=inspect.cleandoc(check.__doc__ or ""),
        ),
        check,
    )
    for check, blocking in _CHECKS
]


def shard_check_results(
    context: dg.AssetExecutionContext, storage: RolloutStorage
) -> Iterator[dg.AssetCheckResult]:
    """The selected checks of `training_shards`, evaluated on the partition's committed step."""
    for spec, check in SHARD_CHECKS:
        if spec.key in context.selected_asset_check_keys:
            result = check(context.partition_key, storage)
            yield dg.AssetCheckResult(
                asset_key=spec.asset_key,
                check_name=spec.name,
                passed=result.passed,
                severity=result.severity,
                description=result.description,
                metadata=result.metadata,
            )


def step_kept_every_rule(
    context: dg.AssetExecutionContext, storage: RolloutStorage
) -> Iterator[dg.AssetCheckResult]:
    """`step_keeps_every_rule` selected without the assets ("Execute checks"): what the
    output root says of the step, its build's refusal record, or else its published step."""
    key = dg.AssetCheckKey(ROLLOUT_SAMPLES_KEY, STEP_KEEPS_EVERY_RULE)
    if key not in context.selected_asset_check_keys:
        return
    step = step_of(context.partition_key)
    root = storage.output_path
    # an object-store root keeps no refusal records (the run's failure carries them)
    record = refused.refused_steps(root).get(step) if isinstance(root, Path) else None
    folder, manifest = _manifest(context.partition_key, storage)
    if record is not None:
        passed, description = False, "\n".join(str(line) for line in record["lines"])
    elif manifest is None:
        passed, description = False, f"step {step} is not built: {folder / MANIFEST} is missing"
    else:
        passed, description = True, None
    yield dg.AssetCheckResult(
        asset_key=ROLLOUT_SAMPLES_KEY,
        check_name=STEP_KEEPS_EVERY_RULE,
        passed=passed,
        severity=dg.AssetCheckSeverity.ERROR,
        description=description,
    )

"""The scheduled run over registered steps whose shards are missing or stale."""

from collections.abc import Sequence
from typing import Any

import dagster as dg

from pipeline.build import read_manifest, shards_are_current
from pipeline.errors import StepError, UsageError
from pipeline.io import writer
from pipeline.io.readers import SourceFile, sha256_of
from pipeline.jobs import rollout_step_job
from pipeline.partitions import rollout_steps, step_of
from pipeline.resources import RolloutStorage
from pipeline.settings import Settings

MISSING = "missing"
STALE = "stale"
REASON_TAG = "rollout_shards/reason"


def _input_sha256(
    sources: Sequence[SourceFile], manifest: dict[str, Any], manifest_mtime_ns: int
) -> list[str]:
    """The inputs' checksums; the manifest's own record when no file is newer than it, which
    spares hashing every input of every step on every tick."""
    recorded = [record["sha256"] for record in manifest.get("inputs", [])]
    unchanged = len(recorded) == len(sources) and all(
        source.path.stat().st_mtime_ns <= manifest_mtime_ns for source in sources
    )
    return recorded if unchanged else [sha256_of(source.path) for source in sources]


def shard_state(
    storage: RolloutStorage, step: int, sources: Sequence[SourceFile], settings: Settings
) -> str | None:
    """`missing`, `stale` (inputs or settings changed since the manifest), or None if current."""
    manifest = read_manifest(storage.output_path, step)
    if manifest is None:
        return MISSING
    mtime = (storage.step_folder(step) / writer.MANIFEST).stat().st_mtime_ns
    hashes = _input_sha256(sources, manifest, mtime)
    return None if shards_are_current(manifest, hashes, settings) else STALE


@dg.schedule(
    job=rollout_step_job,
    cron_schedule="0 * * * *",
    default_status=dg.DefaultScheduleStatus.STOPPED,
)
def stale_shards_schedule(
    context: dg.ScheduleEvaluationContext, rollout_storage: RolloutStorage
) -> list[dg.RunRequest] | dg.SkipReason:
    """Every hour, requests a run for each registered step whose step folder is missing,
    or was written from other input files or other settings than the current ones."""
    try:
        steps = rollout_storage.steps()
        settings = rollout_storage.settings()
    except (UsageError, StepError) as exc:
        return dg.SkipReason(f"cannot read the input root: {exc}")
    requests = []
    for key in sorted(context.instance.get_dynamic_partitions(rollout_steps.name)):
        sources = steps.get(step_of(key))
        if not sources:
            continue
        state = shard_state(rollout_storage, step_of(key), sources, settings)
        if state is not None:
            requests.append(
                dg.RunRequest(partition_key=key, run_key=f"{key}:{state}", tags={REASON_TAG: state})
            )
    return requests or dg.SkipReason("every registered step has current shards")

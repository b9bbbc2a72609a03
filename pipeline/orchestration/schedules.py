"""The scheduled run over registered steps whose shards are missing or stale."""

import os

import dagster as dg

from pipeline.errors import StepError, UsageError
from pipeline.io.storage import ObjectRoot
from pipeline.orchestration.jobs import rollout_step_job
from pipeline.orchestration.partitions import rollout_steps, step_of
from pipeline.orchestration.resources import RolloutStorage
from pipeline.orchestration.stored_steps import store_shard_state
from pipeline.step.freshness import shard_state

REASON_TAG = "rollout_shards/reason"
# A deployment may run the schedule more often than hourly (docs/deploy.md).
CRON_ENV = "ROLLOUT_SHARDS_STALE_CRON"
DEFAULT_CRON = "0 * * * *"


@dg.schedule(
    job=rollout_step_job,
    cron_schedule=os.environ.get(CRON_ENV) or DEFAULT_CRON,
    default_status=dg.DefaultScheduleStatus.STOPPED,
)
def stale_shards_schedule(
    context: dg.ScheduleEvaluationContext, rollout_storage: RolloutStorage
) -> list[dg.RunRequest] | dg.SkipReason:
    """Every hour (or on $ROLLOUT_SHARDS_STALE_CRON), requests a run for each registered
    step whose step folder is missing, or was written from other input files or other
    settings than the current ones."""
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
        out_root, step = rollout_storage.output_path, step_of(key)
        if isinstance(out_root, ObjectRoot):
            state = store_shard_state(out_root, step, sources, settings)
        else:
            state = shard_state(out_root, step, sources, settings)
        if state is not None:
            requests.append(
                dg.RunRequest(partition_key=key, run_key=f"{key}:{state}", tags={REASON_TAG: state})
            )
    return requests or dg.SkipReason("every registered step has current shards")

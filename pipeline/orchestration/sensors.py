"""New or changed step files under the input root -> partitions and run requests."""

import json

import dagster as dg

from pipeline.assets import GROUP
from pipeline.errors import StepError, UsageError
from pipeline.io.checksums import input_digest
from pipeline.orchestration.jobs import rollout_step_job
from pipeline.orchestration.partitions import partition_key, rollout_steps
from pipeline.orchestration.resources import RolloutStorage
from pipeline.step.freshness import (
    content_hash,
    shards_are_current,
    stat_fingerprint,
)

# Hashing is the expensive part; the rest of a folder waits for the next tick.
MAX_STEPS_HASHED_PER_TICK = 200


@dg.sensor(
    job=rollout_step_job,
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.STOPPED,
)
def rollout_steps_sensor(
    context: dg.SensorEvaluationContext, rollout_storage: RolloutStorage
) -> dg.SensorResult | dg.SkipReason:
    """Registers a `rollout_steps` partition for every step under the input root and
    requests a run for each new or changed step. The run key follows the content (the
    files' sha256 and the settings), so an unchanged step is not rerun; the cursor keeps
    each step's file stats, so only steps whose files changed are hashed again."""
    try:
        steps = rollout_storage.steps()
        settings = rollout_storage.settings()
    except (UsageError, StepError) as exc:
        return dg.SkipReason(f"cannot read the input root: {exc}")
    seen: dict[str, list[str]] = json.loads(context.cursor) if context.cursor else {}
    registered = set(context.instance.get_dynamic_partitions(rollout_steps.name))
    new_keys = [partition_key(step) for step in steps if partition_key(step) not in registered]
    cursor: dict[str, list[str]] = {}
    requests = []
    budget, deferred = MAX_STEPS_HASHED_PER_TICK, 0
    for step, sources in steps.items():
        key = partition_key(step)
        stats = stat_fingerprint(sources, settings)
        previous = seen.get(key)
        if previous is not None and previous[0] == stats:
            cursor[key] = previous
            continue
        if budget == 0:
            deferred += 1
            if previous is not None:
                cursor[key] = previous
            continue
        budget -= 1
        hashes = [input_digest(source.path) for source in sources]
        content = content_hash(hashes, settings)
        cursor[key] = [stats, content]
        if previous is not None and previous[1] == content:
            continue
        if shards_are_current(rollout_storage.manifest(step), hashes, settings):
            continue
        requests.append(dg.RunRequest(partition_key=key, run_key=f"{key}:{content}"))
    if deferred:
        context.log.info(f"{deferred} changed steps wait for the next tick")
    return dg.SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=[rollout_steps.build_add_request(new_keys)] if new_keys else [],
        cursor=json.dumps(cursor, separators=(",", ":"), sort_keys=True),
    )


# Evaluates the assets' `automation_condition` (pipeline/assets/__init__.py). Declared here
# rather than left to Dagster's implicit `default_automation_condition_sensor` so that it
# has a name of this project and starts stopped, like `rollout_steps_sensor`. It requests
# runs only for partitions already registered: `rollout_steps_sensor` registers them.
rollout_shards_automation_sensor = dg.AutomationConditionSensorDefinition(
    "rollout_shards_automation_sensor",
    target=dg.AssetSelection.groups(GROUP),
    default_status=dg.DefaultSensorStatus.STOPPED,
    minimum_interval_seconds=60,
    description=(
        "Requests a run for every rollout_steps partition whose assets' automation condition "
        "(AutomationCondition.eager()) is true: a newly registered step, or a step whose "
        "upstream asset was re-materialized."
    ),
)

"""The sensor and the schedule evaluated directly, with their resources passed explicitly
(the roots from the environment, as the deployment's are)."""

from __future__ import annotations

import dagster as dg

from pipeline.orchestration.resources import RolloutStorage
from pipeline.orchestration.schedules import stale_shards_schedule
from pipeline.orchestration.sensors import rollout_steps_sensor


def tick(instance: dg.DagsterInstance, cursor: str | None = None) -> dg.SensorResult:
    """One sensor evaluation; its partition requests applied as the daemon would."""
    # Entered, so that whatever the context opens (resources, an instance from its ref)
    # is closed here and not when it is garbage collected.
    with dg.build_sensor_context(
        instance=instance,
        cursor=cursor,
        resources={"rollout_storage": RolloutStorage.from_env()},
    ) as context:
        result = rollout_steps_sensor(context)
    assert isinstance(result, dg.SensorResult)
    for request in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    return result


def requested(result: dg.SensorResult) -> list[str]:
    """The partition keys of the runs a tick requests, in its order."""
    return [request.partition_key for request in result.run_requests or []]


def schedule(instance: dg.DagsterInstance) -> list[dg.RunRequest] | dg.SkipReason:
    """One evaluation of the stale-shards schedule."""
    with dg.build_schedule_context(
        instance=instance, resources={"rollout_storage": RolloutStorage.from_env()}
    ) as context:
        return stale_shards_schedule(context)

"""`make run`: register every step under the input root and materialize each through Dagster.

Runs execute in this process on the Dagster instance of `DAGSTER_HOME` (the Makefile points
it at `.dagster_home/`), so they appear in `make ui` afterwards.
"""

from __future__ import annotations

import sys
import time

import dagster as dg

from pipeline.definitions import defs
from pipeline.errors import StepError, UsageError
from pipeline.io.readers import SourceFile
from pipeline.orchestration.jobs import rollout_step_job
from pipeline.orchestration.partitions import partition_key, rollout_steps
from pipeline.orchestration.resources import RolloutStorage
from pipeline.step.build import alarm_lines, summary_line
from pipeline.step.freshness import read_manifest

PROG = "rollout-shards (dagster)"
# The instance keeps every event for the UI; the terminal gets one line per step.
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def _instance() -> dg.DagsterInstance:
    try:
        return dg.DagsterInstance.get()
    except dg.DagsterHomeNotSetError:
        return dg.DagsterInstance.ephemeral()


def _summary(step: int, storage: RolloutStorage, seconds: float) -> str:
    manifest = read_manifest(storage.output_path, step)
    if manifest is None:
        return f"step {step}: materialized, but {storage.step_folder(step)} has no manifest"
    line = f"{summary_line(manifest, storage.step_folder(step))} ({seconds:.1f}s)"
    return "\n".join([line, *alarm_lines(manifest)])


def _failure(result: dg.ExecuteInProcessResult) -> str:
    for event in result.all_events:
        if event.is_step_failure and event.step_failure_data is not None:
            data = event.step_failure_data
            text = data.user_failure_data.description if data.user_failure_data else None
            text = text or (data.error.message.strip() if data.error else "failed")
            return f"{event.step_key}: {text}"
    return "failed"


def _materialize_all(
    instance: dg.DagsterInstance, storage: RolloutStorage, steps: dict[int, list[SourceFile]]
) -> int:
    """Register the steps' partitions, run each step; returns how many failed."""
    keys = [partition_key(step) for step in steps]
    registered = set(instance.get_dynamic_partitions(rollout_steps.name))
    instance.add_dynamic_partitions(rollout_steps.name, [k for k in keys if k not in registered])
    job = defs.resolve_job_def(rollout_step_job.name)
    failed = 0
    for step, key in zip(steps, keys, strict=True):
        started = time.perf_counter()
        result = job.execute_in_process(
            run_config=QUIET,
            partition_key=key,
            instance=instance,
            resources={"rollout_storage": storage},
            raise_on_error=False,
        )
        if result.success:
            print(_summary(step, storage, time.perf_counter() - started))
        else:
            failed += 1
            print(f"{PROG}: step {step}: {_failure(result)}", file=sys.stderr)
    return failed


def main() -> int:
    storage = RolloutStorage.from_env()
    try:
        steps = storage.steps()
    except (UsageError, StepError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    if not steps:
        print(f"{PROG}: no rollout tables under {storage.input_path}", file=sys.stderr)
        return 2
    with _instance() as instance:
        failed = _materialize_all(instance, storage, steps)
    print(
        f"shards of {len(steps) - failed} of {len(steps)} steps under {storage.output_path}/ "
        "(one step=<N>/ folder per step, manifest.json in each)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""`make run`: register every step under the input root and materialize each through Dagster.

Runs execute in this process on the Dagster instance of `DAGSTER_HOME` (the Makefile gives
each pair of roots a home of its own under `.dagster_home/`), so they appear in `make ui`
afterwards. Steps whose shards are current are skipped, as `rollout-shards build` does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

import dagster as dg

from pipeline.definitions import defs
from pipeline.errors import PROG, StepError, UsageError, error_lines
from pipeline.io.discovery import SourceFile
from pipeline.io.storage import is_remote
from pipeline.orchestration.jobs import rollout_step_job
from pipeline.orchestration.partitions import partition_key, rollout_steps
from pipeline.orchestration.resources import RolloutStorage
from pipeline.settings import Settings
from pipeline.step.build import quarantine_lines, summary_line, warning_lines
from pipeline.step.freshness import current_manifest, read_manifest

INPUT_ROOT_TAG = "rollout_shards/input_root"
OUTPUT_ROOT_TAG = "rollout_shards/output_root"
# `make run FORCE=1`: rebuild steps that are current, as `rollout-shards build --force` does.
FORCE_ENV = "ROLLOUT_SHARDS_FORCE"

# The instance keeps every event (stack traces too) for the UI; the terminal gets the
# CLI's lines for a failed step and where its logs are, so only critical events print.
QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


def _instance() -> dg.DagsterInstance:
    # dagster does not export DagsterHomeNotSetError: ask the environment instead.
    if os.environ.get("DAGSTER_HOME"):
        return dg.DagsterInstance.get()
    return dg.DagsterInstance.ephemeral()


def _summary(step: int, storage: RolloutStorage, seconds: float) -> str:
    manifest = read_manifest(storage.output_path, step)
    if manifest is None:
        return f"step {step}: materialized, but {storage.step_folder(step)} has no manifest"
    for warning in quarantine_lines(manifest, storage.output_path) + warning_lines(manifest):
        print(f"{PROG}: build: {warning}", file=sys.stderr)
    return f"{summary_line(manifest, storage.step_folder(step))} ({seconds:.1f}s)"


def root_tags(storage: RolloutStorage) -> dict[str, str]:
    """The roots a run built from and into, as run tags: runs of different roots that share
    one Dagster home stay apart in the UI's run list (filter by tag)."""
    return {
        INPUT_ROOT_TAG: str(storage.input_path.resolve()),
        OUTPUT_ROOT_TAG: str(storage.output_path.resolve()),
    }


def _settings(storage: RolloutStorage) -> Settings | None:
    """The run's settings, or None when they do not load: each step's run then fails with
    the cause, as it would from the UI."""
    try:
        return storage.settings()
    except UsageError:
        return None


def _current(
    storage: RolloutStorage, step: int, sources: list[SourceFile], settings: Settings
) -> bool:
    return current_manifest(step, sources, settings, storage.output_path) is not None


def _failure(result: dg.ExecuteInProcessResult) -> list[str]:
    """The lines the CLI prints for the failed step (a dg.Failure from
    `failures_reported` carries them), else the error's first line."""
    for event in result.all_events:
        if event.is_step_failure and event.step_failure_data is not None:
            data = event.step_failure_data
            text = data.user_failure_data.description if data.user_failure_data else None
            if text:
                return text.splitlines()
            message = data.error.message.strip() if data.error else ""
            first = message.splitlines()[0] if message else "failed"
            return [f"{PROG}: build: {event.step_key}: {first}"]
    return [f"{PROG}: build: failed"]


def _where(instance: dg.DagsterInstance, run_id: str, storage: RolloutStorage) -> str:
    """Where the failed run's logs are, and the `make ui` that shows them: the UI of one
    pair of roots serves their Dagster home (Makefile), so it names the run's roots."""
    home = os.environ.get("DAGSTER_HOME")
    if home and not instance.is_ephemeral:
        ui = f"make ui INPUT={storage.input_path} OUTPUT={storage.output_path}"
        return f"run {run_id} in {home} (`{ui}`, Runs)"
    return f"run {run_id} (an ephemeral instance: set DAGSTER_HOME to keep the logs)"


@contextlib.contextmanager
def _sigterm_kept() -> Iterator[None]:
    """A Dagster run in process points SIGTERM at SIGINT's handler (for k8s) and leaves it
    there. Started where SIGINT is ignored (a script's `make run &`), this process would then
    ignore SIGTERM, and so would every process it starts after: `kill` could not stop it. So
    SIGTERM's handler is put back after each run."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread sets handlers, Dagster's too
        return
    before = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _materialize_all(
    instance: dg.DagsterInstance, storage: RolloutStorage, steps: dict[int, list[SourceFile]]
) -> int:
    """Register the steps' partitions, run each step; returns how many failed."""
    keys = [partition_key(step) for step in steps]
    registered = set(instance.get_dynamic_partitions(rollout_steps.name))
    instance.add_dynamic_partitions(rollout_steps.name, [k for k in keys if k not in registered])
    job = defs.resolve_job_def(rollout_step_job.name)
    settings = _settings(storage)
    force = os.environ.get(FORCE_ENV, "") not in ("", "0")
    failed = 0
    for step, key in zip(steps, keys, strict=True):
        if settings is not None and not force and _current(storage, step, steps[step], settings):
            print(
                f"step {step}: up to date, skipped: {storage.step_folder(step)} was built from "
                "the same inputs and settings (make run FORCE=1 rebuilds it)"
            )
            continue
        started = time.perf_counter()
        with _sigterm_kept():
            result = job.execute_in_process(
                run_config=QUIET,
                partition_key=key,
                instance=instance,
                resources={"rollout_storage": storage},
                tags=root_tags(storage),
                raise_on_error=False,
            )
        if result.success:
            print(_summary(step, storage, time.perf_counter() - started))
        else:
            failed += 1
            for line in _failure(result):
                print(line, file=sys.stderr)
            print(
                f"{PROG}: step {step}: logs: {_where(instance, result.run_id, storage)}",
                file=sys.stderr,
            )
    return failed


def main() -> int:
    storage = RolloutStorage.from_env()
    remote = [str(root) for root in (storage.input_path, storage.output_path) if is_remote(root)]
    if remote:  # its summaries and skips read step folders on disk
        print(
            f"{PROG}: usage error: make run builds local roots only, not {remote[0]}: use "
            "`rollout-shards build` or the Dagster sensor and jobs (docs/deploy.md)",
            file=sys.stderr,
        )
        return 2
    try:
        steps = storage.steps()
    except (UsageError, StepError) as exc:
        for line in error_lines("build", exc):
            print(line, file=sys.stderr)
        return 2 if isinstance(exc, UsageError) else 1
    if not steps:
        print(f"{PROG}: usage error: no rollout tables under {storage.input_path}", file=sys.stderr)
        return 2
    with _instance() as instance:
        failed = _materialize_all(instance, storage, steps)
    print(
        f"shards of {len(steps) - failed} of {len(steps)} steps under {storage.output_path}/ "
        "(one step=<N>/ folder per step, manifest.json in each; "
        f"Dagster runs in {os.environ.get('DAGSTER_HOME') or 'an ephemeral instance'})"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

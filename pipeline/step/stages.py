"""What each asset of a step computes, without Dagster: the same code in process or in a
Pipes worker (`pipeline.orchestration.pipes_worker`) on another process, Ray node or Kubernetes pod.

`run_stages` runs the selected stages of a step in order through the one driver
(`build.run_step`): the first reads the step's tables (or the previous stage's staging
folder when that stage ran on its own), each stage takes what the one before handed it in
memory, and each yields a `StageDone`: the asset's value and where it was staged. What
Dagster shows of it (a log line and the materialization metadata) is the orchestration's
(`pipeline.orchestration.stage_reports`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import UsageError
from pipeline.io import writer
from pipeline.io.storage import ObjectRoot
from pipeline.manifest import Manifest
from pipeline.settings import Settings, make_settings
from pipeline.step import ROLLOUT_SAMPLES, STAGES, TRAIN_BATCH, TRAINING_SHARDS, staging
from pipeline.step.build import StepJob, run_step
from pipeline.step.roots import StepRoots
from pipeline.step.store_commit import commit_step
from pipeline.step.tables import SampleTable, TrainBatch


@dataclass(frozen=True)
class StageDone:
    """One asset computed: its value (the step's rows, its batch, or the manifest of the
    committed step), the staging folder it was saved to (None: handed on in memory), the
    step's batch (the manifest's rows) and the step's output folder."""

    value: SampleTable | TrainBatch | Manifest
    staged: Path | None
    batch: TrainBatch | None
    folder: Path


def selected_stages(names: Iterable[str]) -> list[str]:
    """The selected assets in the order their stages run; an unknown name is refused."""
    chosen = set(names)
    unknown = sorted(chosen - set(STAGES))
    if unknown:
        raise UsageError(f"unknown stage {unknown[0]!r}; one of {', '.join(STAGES)}")
    return [name for name in STAGES if name in chosen]


def run_stages(
    names: Iterable[str],
    roots: StepRoots,
    step: int,
    settings: Settings | None,
    route: Callable[[StepJob], StepJob] | None = None,
) -> Iterator[tuple[str, StageDone]]:
    """Run the selected stages of one step in order, yielding each asset as soon as it is
    done. What one stage hands the next stays in memory; an output is staged only
    when the next stage is not selected (it will run on its own, later), and a staged copy
    that this run supersedes without staging is removed, so a later stage run on its own
    never reads a stale one. A stage whose input is not produced here reads it from staging.
    The run holds the step's lock (`writer.step_lock`), as a CLI build does. `route` may
    give a run from the read through the write another reader and writer (Ray tasks,
    `step/ray_ranks.py`)."""
    stages = selected_stages(names)
    if isinstance(roots.output_root, ObjectRoot):  # no lock file: the conditional PUT decides
        yield from _run_to_store(stages, roots, roots.output_root, step, settings, route)
        return
    with writer.step_lock(roots.output_root, step):
        yield from _run_selected(stages, roots, step, settings, route)


def _runs(stages: list[str]) -> list[list[str]]:
    """The selected stages as runs of consecutive stages (`STAGES` order)."""
    runs: list[list[str]] = []
    for name in stages:
        if runs and STAGES.index(name) == STAGES.index(runs[-1][-1]) + 1:
            runs[-1].append(name)
        else:
            runs.append([name])
    return runs


def _run_selected(
    stages: list[str],
    roots: StepRoots,
    step: int,
    settings: Settings | None,
    route: Callable[[StepJob], StepJob] | None,
) -> Iterator[tuple[str, StageDone]]:
    for run in _runs(stages):
        first, last = run[0], run[-1]
        given: SampleTable | TrainBatch | None = None
        run_settings = settings
        if first == ROLLOUT_SAMPLES and settings is None:
            raise UsageError(f"step {step}: {ROLLOUT_SAMPLES} needs the run's settings")
        if first == TRAIN_BATCH:
            given, run_settings = staging.load_samples(roots, step)  # planned as validated
        elif first == TRAINING_SHARDS:
            given = staging.load_batch(roots, step)
            run_settings = run_settings or make_settings(given.meta.settings)
        assert run_settings is not None
        sources = roots.step_sources(step) if first == ROLLOUT_SAMPLES else []
        assert isinstance(roots.output_root, Path)  # an object store's is `_run_to_store`
        job = StepJob(step, sources, run_settings, roots.output_root)
        if route is not None and (first, last) == (ROLLOUT_SAMPLES, TRAINING_SHARDS):
            job = route(job)
        batch = given if isinstance(given, TrainBatch) else None
        for name, value in run_step(job, first, last, given):
            # the next stage takes this one's output in memory, or a later run of its own
            # takes it from staging
            hand_on = name != last
            staged = None
            if isinstance(value, SampleTable):
                staged = _hand_on_or_stage(
                    hand_on, roots, name, step, staging.save_samples, value, run_settings
                )
            elif isinstance(value, TrainBatch):
                staged = _hand_on_or_stage(hand_on, roots, name, step, staging.save_batch, value)
                batch = value
            else:
                assert batch is not None and isinstance(value, Manifest)
            yield name, StageDone(value, staged, batch, roots.step_folder(step))
            del value


def _run_to_store(
    stages: list[str],
    roots: StepRoots,
    root: ObjectRoot,
    step: int,
    settings: Settings | None,
    route: Callable[[StepJob], StepJob] | None = None,
) -> Iterator[tuple[str, StageDone]]:
    """The three stages together to an object-store output root: read and plan in this
    process (or by Ray's tasks, `route`), then `store_commit` uploads the files (from
    those tasks) and commits the manifest. Anything else
    would stage an asset there, or read one staged (`StepRoots.staging_folder` says why not).
    """
    if stages != list(STAGES):
        raise UsageError(
            f"step {step}: {' and '.join(stages)} alone would read or leave staged assets, "
            f"but the output root {root} is an object store, which keeps none: materialize "
            "the three assets of the step together"
        )
    if settings is None:
        raise UsageError(f"step {step}: {ROLLOUT_SAMPLES} needs the run's settings")
    job = StepJob(step, roots.step_sources(step), settings, None)  # no refusal record there
    if route is not None:  # Ray's tasks read the step and encode and PUT its files
        job = route(job)
    folder = roots.step_folder(step)
    batch: TrainBatch | None = None
    for name, value in run_step(job, ROLLOUT_SAMPLES, TRAIN_BATCH):
        batch = value if isinstance(value, TrainBatch) else batch
        yield name, StageDone(value, None, batch, folder)
    assert batch is not None
    yield TRAINING_SHARDS, StageDone(commit_step(batch, root, job.tasks), None, batch, folder)


def _hand_on_or_stage(
    hand_on: bool,
    roots: StepRoots,
    asset: str,
    step: int,
    save: Callable[..., Path],
    *value: Any,
) -> Path | None:
    """Stage an asset for a later run of its downstream stage, or (handed on in memory)
    remove what an earlier run staged for it, which this run has superseded."""
    if hand_on:
        staging.discard(roots, asset, step)
        return None
    return save(roots, *value)

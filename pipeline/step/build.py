"""The one driver of a step: `run_step` reads, validates, plans, writes and commits it.

The CLI's `build` (`build_step`) and `validate`, and the Dagster assets in process or in a
Pipes worker on another process, Ray node or Kubernetes pod (`stages.run_stages`) all run
it; a step on a Ray cluster is the same run with the reader and writer of
`step.readers.shares` handed in (`route`, from `step/ray_route.py`), so the core never
imports Ray.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pipeline import trainers
from pipeline.errors import StepError
from pipeline.io import writer
from pipeline.io.discovery import SourceFile
from pipeline.io.storage import ObjectRoot
from pipeline.io.store_layout import attempt_of, output_key
from pipeline.manifest import Manifest
from pipeline.settings import RowSettings, Settings
from pipeline.speed import EarlyDigests
from pipeline.step import ROLLOUT_SAMPLES, STAGES, TRAIN_BATCH, TRAINING_SHARDS, refused
from pipeline.step.check import check
from pipeline.step.freshness import current_manifest
from pipeline.step.plan import plan_batch, untrained_warning
from pipeline.step.readers import Reader
from pipeline.step.readers.memory import MemoryReader
from pipeline.step.readers.spill import Spill, SpillReader, input_bytes
from pipeline.step.tables import SampleTable, TrainBatch
from pipeline.step.write import write_shards
from pipeline.transforms import metrics
from pipeline.transforms.reward_groups import GROUP_RULE

# A step is worth a look when more than half of its prompt groups have one reward (GRPO
# learns nothing from them) or more than a tenth of its samples were truncated.
ZERO_STD_ALARM = 0.5
TRUNCATION_ALARM = 0.1

STAGE_NAMES = ("read and validate", "plan", "write")


class StageReporter(Protocol):
    """Told when each stage of a step starts and ends (the CLI's progress)."""

    def begin(self, step: int, stage: str) -> None: ...

    def end(self, step: int, stage: str, detail: str) -> None: ...

    def up_to_date(self, step: int, folder: Path | str) -> None:
        """The step's folder is current: nothing was built."""


class _Silent:
    def begin(self, step: int, stage: str) -> None:
        pass

    def end(self, step: int, stage: str, detail: str) -> None:
        pass

    def up_to_date(self, step: int, folder: Path | str) -> None:
        pass


# A reader made for one build, with what it holds until the build ends (a spill folder, a
# connection) entered on the build's exit stack.
OpenReader = Callable[["StepJob", ExitStack], Reader]


@dataclass(frozen=True)
class StepJob:
    """One step to build: its files, settings and where it goes, how it is read when it is
    written (`reader`; None: in memory or in parts, by `stream_above`) and how its ranks are
    written (`write_batch`: in this process, or Ray tasks, `step/ray_ranks.py`).
    A run that stops before the write reads in memory whatever `reader` says, unless it
    writes nothing at all (`validate`, no `out_root`): a Dagster stage stages its rows."""

    step: int
    sources: Sequence[SourceFile]
    settings: Settings | RowSettings  # RowSettings: the rows alone (`validate` without a batch)
    out_root: Path | None  # None: nothing is written (`validate`)
    skipped: Sequence[str] = ()  # look-alike files the readers passed over, kept in the manifest
    early: EarlyDigests | None = None  # digests of input files taken before the build
    write_batch: Callable[[TrainBatch, Path], Manifest] = write_shards
    reader: OpenReader | None = None
    # the tasks a routed job runs on (`readers.shares.by_tasks`): an object-store write
    # asks them too (`store_commit`), having no `write_batch` of a local root
    tasks: Any = None

    def open_reader(self, stack: ExitStack, writes: bool) -> Reader:
        """The reader of a run that `writes` the step (through to its shards) or not."""
        if self.reader is not None and (writes or self.out_root is None):
            return self.reader(self, stack)
        if writes and self.streamed():
            assert self.out_root is not None
            return SpillReader(stack.enter_context(Spill(self.out_root, self.step)))
        return MemoryReader()

    def streamed(self) -> bool:
        """Whether the step is read in parts with its lists spilled (`readers.spill`), chosen up
        front from the size of its input files on disk and `stream_above`: only a build that
        writes holds the lists until then."""
        if self.out_root is None or not isinstance(self.settings, Settings):
            return False
        above = self.settings.stream_above_bytes
        return above is not None and input_bytes(self.sources) > above


Stage = SampleTable | TrainBatch | Manifest


def run_step(
    job: StepJob,
    first: str = ROLLOUT_SAMPLES,
    last: str = TRAINING_SHARDS,
    given: SampleTable | TrainBatch | None = None,
    reporter: StageReporter | None = None,
) -> Iterator[tuple[str, Stage]]:
    """THE build of a step: read -> check -> plan -> write -> commit, from stage `first`
    through `last` (`step.STAGES`), yielding each stage's result as soon as it is done. A
    run from a later stage than the read starts from `given` (what an earlier run of the
    previous stage staged). Every path that builds a step runs this: `build_step` (the CLI,
    a Ray cluster's tasks), `stages.run_stages` (Dagster, in process or in a Pipes worker),
    and `validate`, which stops after the plan. A run that writes leaves the record of a
    refused step in the output root, and removes it once the step is committed
    (`step.refused`)."""
    try:
        yield from _run_step(job, first, last, given, reporter)
    except StepError as error:
        if job.out_root is not None:
            with suppress(OSError):  # the refusal is the error to report, not the record's
                refused.write_record(job.out_root, job.step, error, job.sources, job.settings)
        raise
    if job.out_root is not None and last == TRAINING_SHARDS:
        with suppress(OSError):  # a record left is harmless: the committed step is read first
            refused.clear_record(job.out_root, job.step)


def _run_step(
    job: StepJob,
    first: str,
    last: str,
    given: SampleTable | TrainBatch | None,
    reporter: StageReporter | None,
) -> Iterator[tuple[str, Stage]]:
    report = reporter or _Silent()
    read, plan, write = STAGE_NAMES
    selected = STAGES[STAGES.index(first) : STAGES.index(last) + 1]
    step = job.step
    with ExitStack() as stack:
        reader: Reader = MemoryReader()
        samples = given if isinstance(given, SampleTable) else None
        batch = given if isinstance(given, TrainBatch) else None
        if ROLLOUT_SAMPLES in selected:
            report.begin(step, read)
            reader = job.open_reader(stack, last == TRAINING_SHARDS)
            samples = check(reader.read(job), job.settings)
            report.end(step, read, f"{samples.ingested} rows read")
            yield ROLLOUT_SAMPLES, samples
        if TRAIN_BATCH in selected:
            assert samples is not None, "the plan starts from the step's samples"
            assert isinstance(job.settings, Settings), "a plan needs the batch settings"
            report.begin(step, plan)
            batch = plan_batch(samples, job.settings)
            del samples  # the batch keeps what it needs of the rows
            batch.meta = batch.meta.replace(skipped_files=list(job.skipped))
            batch = reader.planned(batch)
            report.end(step, plan, f"{batch.meta.counts.written} rows to write")
            yield TRAIN_BATCH, batch
        if TRAINING_SHARDS in selected:
            assert batch is not None and job.out_root is not None, "the write needs a batch"
            report.begin(step, write)
            manifest = job.write_batch(batch, job.out_root)
            report.end(step, write, f"{len(manifest.outputs)} files")
            yield TRAINING_SHARDS, manifest


def build_step(
    step: int,
    sources: Sequence[SourceFile],
    settings: Settings,
    out_root: Path | ObjectRoot,
    force: bool = False,
    reporter: StageReporter | None = None,
    skipped: Sequence[str] = (),
    early: EarlyDigests | None = None,
    route: Callable[[StepJob], StepJob] | None = None,
) -> Manifest:
    """The whole build of one step (`run_step`); returns its manifest. A step folder that is
    current (`current_manifest`) is kept as it is unless `force`; any other is replaced
    whole. Builds of one step run one at a time (`writer.step_lock`), so the last published
    read the newest inputs. `route` may give the job another reader and writer (the Ray
    route of `step/ray_ranks.py`). An object-store root is built by
    `store_commit.build_to_store`, with the same meaning."""
    report = reporter or _Silent()
    if isinstance(out_root, ObjectRoot):
        from pipeline.step.store_commit import build_to_store  # it builds on this module

        job = StepJob(step, sources, settings, None, skipped, early)
        return build_to_store(job, out_root, force, report, route)
    with writer.step_lock(out_root, step):
        if not force and (manifest := current_manifest(step, sources, settings, out_root)):
            with suppress(OSError):  # those inputs are back: the step stands
                refused.clear_record(out_root, step)
            report.up_to_date(step, writer.step_folder(out_root, step))
            return manifest
        job = StepJob(step, sources, settings, out_root, skipped, early)
        if route is not None:
            job = route(job)
        built: Stage | None = None
        for stage in run_step(job, reporter=report):
            built = stage[1]  # each stage's result is let go as the next is made
        assert isinstance(built, Manifest)
        return built


def summary_line(manifest: Manifest, folder: Path | str) -> str:
    """One line per built step, as the CLI and `make run` print it. Untrained rows are
    written but fall past each rank's last whole optimizer step (SEMANTICS 6.1); repaired
    rows (shown when any) had their rollout id cleared or stamped. A batch is compact when
    some row has a rollout id (session-v2 multi-leaf trajectories): it is kept in whole
    rollouts, not trimmed by row count."""
    n = manifest.counts
    kind = "compact" if manifest.is_compact else "not compact"
    repaired = f"{n.repaired} repaired, " if n.repaired else ""
    return (
        f"step {manifest.step}: {n.ingested} rows in, {n.quarantined} quarantined"
        f"{_stale(manifest)}{_kept_whole(manifest)}, "
        f"{n.trimmed} trimmed, {n.dropped} dropped, {n.written} written to "
        f"{_count(manifest.dp_size, 'rank')}, {n.untrained} untrained, {repaired}"
        f"{_count(manifest.num_train_steps, 'train step')}, {kind} -> {folder}"
    )


def _stale(manifest: Manifest) -> str:
    """What of `quarantined` the trainer's own filter set aside, in its words (miles'
    weight-staleness budget: its groups and rows), or nothing."""
    trainer = manifest.settings.get("trainer", trainers.NAMES[0])
    return trainers.profile(trainer).set_aside_words(manifest.stats)


def _kept_whole(manifest: Manifest) -> str:
    """The rows of `quarantined` set aside with their reward groups (SEMANTICS 5.4)."""
    rows = manifest.quarantined_rules.get(GROUP_RULE, 0)
    return f" ({_count(rows, 'row')} of reward groups kept whole)" if rows else ""


def quarantine_lines(manifest: Manifest, out_root: Path | ObjectRoot) -> list[str]:
    """One line per rule that quarantined rows of a built step, with its row count and the
    quarantine file (`build` and `make run` print them on stderr)."""
    if not manifest.counts.quarantined:
        return []
    where: Path | str
    if isinstance(out_root, ObjectRoot):  # inside the attempt prefix the manifest names
        path = writer.quarantine_output(manifest.step)
        key = output_key(manifest.step, attempt_of(manifest.to_json()), path)
        where = out_root.url(key)
    else:
        where = writer.quarantine_path(out_root, manifest.step)
    return [
        f"step {manifest.step}: {_count(rows, 'row')} quarantined by {rule} -> {where}"
        for rule, rows in manifest.quarantined_rules.items()
    ]


def _count(number: int, thing: str) -> str:
    return f"{number} {thing}" + ("" if number == 1 else "s")


def warning_lines(manifest: Manifest) -> list[str]:
    """Every warning of a built step: its alarming rollout metrics and its untrained rows
    (the CLI and `make run` print them on stderr)."""
    untrained = untrained_warning(manifest)
    return alarm_lines(manifest) + ([untrained] if untrained else [])


def alarm_lines(manifest: Manifest) -> list[str]:
    """A warning line for each alarming rollout metric of the step (none when all is well)."""
    stats, lines = manifest.stats, []
    zero_std = stats.get(metrics.ZERO_STD_RATIO, 0.0)
    if zero_std > ZERO_STD_ALARM:
        counts = ", ".join(
            f"{name.removeprefix(metrics.ZERO_STD + 'count_')}: {int(count)}"
            for name, count in stats.items()
            if name.startswith(metrics.ZERO_STD + "count_")
        )
        lines.append(
            f"step {manifest.step}: warning: {zero_std:.0%} of prompt groups have zero reward "
            f"std (groups by their one reward {counts}): they give GRPO no signal"
        )
    truncated = stats.get(metrics.TRUNCATED_RATIO, 0.0)
    if truncated > TRUNCATION_ALARM:
        lines.append(
            f"step {manifest.step}: warning: {truncated:.0%} of samples were truncated "
            f"({metrics.TRUNCATED_RATIO}); a longer rollout max response length keeps them whole"
        )
    return lines

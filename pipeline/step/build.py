"""One step from sample files to a committed shard folder: ingest, plan, write.

`rollout-shards build` calls `build_step`; the Dagster assets call the three stages one
by one (`pipeline.step.stages`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Protocol

from pipeline.io import writer
from pipeline.io.background import EarlyDigests
from pipeline.io.discovery import SourceFile
from pipeline.manifest import Manifest
from pipeline.settings import Settings
from pipeline.step import bounded
from pipeline.step.freshness import current_manifest
from pipeline.step.ingest import load_samples
from pipeline.step.plan import plan_batch, untrained_warning
from pipeline.step.tables import TrainBatch
from pipeline.step.write import write_shards
from pipeline.transforms import metrics
from pipeline.transforms.staleness import STALE_GROUPS, STALE_ROWS

# A step is worth a look when more than half of its prompt groups have one reward (GRPO
# learns nothing from them) or more than a tenth of its samples were truncated.
ZERO_STD_ALARM = 0.5
TRUNCATION_ALARM = 0.1

STAGE_NAMES = ("read and validate", "plan", "write")


class StageReporter(Protocol):
    """Told when each stage of a step starts and ends (the CLI's progress)."""

    def begin(self, step: int, stage: str) -> None: ...

    def end(self, step: int, stage: str, detail: str) -> None: ...

    def up_to_date(self, step: int, folder: Path) -> None:
        """The step's folder is current: nothing was built."""


class _Silent:
    def begin(self, step: int, stage: str) -> None:
        pass

    def end(self, step: int, stage: str, detail: str) -> None:
        pass

    def up_to_date(self, step: int, folder: Path) -> None:
        pass


def build_step(
    step: int,
    sources: Sequence[SourceFile],
    settings: Settings,
    out_root: Path,
    force: bool = False,
    reporter: StageReporter | None = None,
    skipped: Sequence[str] = (),
    stream_above: int | None = bounded.STREAM_ABOVE,
    write_batch: Callable[[TrainBatch, Path], Manifest] = write_shards,
    early: EarlyDigests | None = None,
) -> Manifest:
    """The whole build of one step; returns its manifest. A step folder that is current
    (`current_manifest`) is kept as it is unless `force`; any other is replaced whole.
    `skipped` names look-alike files the readers passed over, kept in the manifest;
    `early` gives digests of input files taken before the build (`load_step`). Builds
    of one step run one at a time (`writer.step_lock`), so the last published read the
    newest inputs. A step whose input files take more than `stream_above` bytes on disk
    holds its per-token lists one part or one rank at a time (`bounded`; None: never).
    `write_batch` writes and commits the planned batch (Ray tasks: `orchestration/ray_ranks.py`)."""
    report = reporter or _Silent()
    with writer.step_lock(out_root, step):
        if not force and (manifest := current_manifest(step, sources, settings, out_root)):
            report.up_to_date(step, writer.step_folder(out_root, step))
            return manifest
        streamed = stream_above is not None and bounded.input_bytes(sources) > stream_above
        return _build(
            step, sources, settings, out_root, report, skipped, streamed, write_batch, early
        )


def _build(
    step: int,
    sources: Sequence[SourceFile],
    settings: Settings,
    out_root: Path,
    report: StageReporter,
    skipped: Sequence[str],
    streamed: bool = False,
    write_batch: Callable[[TrainBatch, Path], Manifest] = write_shards,
    early: EarlyDigests | None = None,
) -> Manifest:
    read, plan, write = STAGE_NAMES
    with ExitStack() as stack:
        report.begin(step, read)
        spill = stack.enter_context(bounded.Spill(out_root, step)) if streamed else None
        samples = bounded.samples_or_none(step, sources, settings, spill, early) if spill else None
        if samples is None:
            stack.close()
            spill = None
            samples = load_samples(step, sources, settings, early)
        report.end(step, read, f"{samples.ingested} rows read")

        report.begin(step, plan)
        batch = plan_batch(samples, settings)
        del samples  # the batch keeps what it needs of the rows
        batch.meta = batch.meta.replace(skipped_files=list(skipped))
        if spill is not None:
            batch = bounded.spilled(batch, spill)
        report.end(step, plan, f"{batch.meta.counts.written} rows to write")

        report.begin(step, write)
        manifest = write_batch(batch, out_root)
        report.end(step, write, f"{len(manifest.outputs)} files")
    return manifest


def summary_line(manifest: Manifest, folder: Path) -> str:
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
        f"{_stale(manifest)}, "
        f"{n.trimmed} trimmed, {n.dropped} dropped, {n.written} written to "
        f"{_count(manifest.dp_size, 'rank')}, {n.untrained} untrained, {repaired}"
        f"{_count(manifest.num_train_steps, 'train step')}, {kind} -> {folder}"
    )


def _stale(manifest: Manifest) -> str:
    """With max_weight_staleness, the groups and rows of `quarantined` it set aside."""
    if STALE_GROUPS not in manifest.stats:
        return ""
    groups, rows = int(manifest.stats[STALE_GROUPS]), int(manifest.stats[STALE_ROWS])
    return f" ({_count(groups, 'stale group')}, {_count(rows, 'row')})"


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

"""One step from sample files to a committed shard folder: ingest, plan, write.

`rollout-shards build` calls `build_step`; the Dagster assets call the three stages one
by one (`pipeline.step.stages`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from pipeline.io.readers import SourceFile
from pipeline.manifest import Manifest
from pipeline.settings import Settings
from pipeline.step.freshness import current_manifest
from pipeline.step.ingest import load_samples
from pipeline.step.plan import plan_batch
from pipeline.step.write import write_shards

STAGE_NAMES = ("read and validate", "plan", "write")


class StageReporter(Protocol):
    """Told when each stage of a step starts and ends (the CLI's progress)."""

    def begin(self, step: int, stage: str) -> None: ...

    def end(self, step: int, stage: str, detail: str) -> None: ...


class _Silent:
    def begin(self, step: int, stage: str) -> None:
        pass

    def end(self, step: int, stage: str, detail: str) -> None:
        pass


def build_step(
    step: int,
    sources: Sequence[SourceFile],
    settings: Settings,
    out_root: Path,
    force: bool = False,
    reporter: StageReporter | None = None,
    skipped: Sequence[str] = (),
) -> Manifest:
    """The whole build of one step; returns its manifest. A step folder that is current
    (`current_manifest`) is kept as it is unless `force`; any other is replaced whole.
    `skipped` names look-alike files the readers passed over, kept in the manifest."""
    if not force and (manifest := current_manifest(step, sources, settings, out_root)):
        return manifest
    report = reporter or _Silent()
    read, plan, write = STAGE_NAMES
    report.begin(step, read)
    samples = load_samples(step, sources, settings)
    report.end(step, read, f"{samples.ingested} rows read")
    report.begin(step, plan)
    batch = plan_batch(samples, settings)
    batch.meta = batch.meta.model_copy(update={"skipped_files": list(skipped)})
    report.end(step, plan, f"{batch.meta.counts.written} rows to write")
    report.begin(step, write)
    manifest = write_shards(batch, out_root)
    report.end(step, write, f"{len(manifest.outputs)} files")
    return manifest


def summary_line(manifest: Manifest, folder: Path) -> str:
    """One line per built step, as the CLI and `make run` print it. A batch is compact
    when some row has a rollout id (session-v2 multi-leaf trajectories): it is kept in
    whole rollouts, not trimmed by row count."""
    n = manifest.counts
    kind = "compact" if manifest.is_compact else "not compact"
    return (
        f"step {manifest.step}: {n.ingested} rows in, {n.quarantined} quarantined, "
        f"{n.trimmed} trimmed, {n.dropped} dropped, {n.written} written to "
        f"{manifest.dp_size} ranks, {manifest.num_train_steps} train steps, "
        f"{kind} -> {folder}"
    )

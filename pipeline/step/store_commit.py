"""A step committed to an object store, where there is no rename: the manifest is the commit.

The layout is `io.store_layout`'s: the files under an attempt prefix named by the
manifest's seal, the manifest at `step=<N>/manifest.json`. A reader follows the manifest
alone, never a listing, so a listing that lags cannot show it a half step. The build encodes
every file in memory (its digest goes in the manifest, the manifest's seal names the
prefix), PUTs them under the prefix, then PUTs the manifest conditionally: `If-None-Match:
*` when the build found no manifest, `If-Match: <etag>` of the one it found when it
replaces a step. The store decides which of two racing builds commits; the other one
removes its files and fails with one line. A crash before the manifest leaves files no
manifest names: the next build of the step removes them once they are older than the
grace period (`ABANDONED_AFTER_S`), which keeps a running build's files and a replaced
step's files a reader may still be reading.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Callable, Sequence
from contextlib import suppress
from datetime import UTC, datetime

import polars as pl

from pipeline import columns as c
from pipeline import report
from pipeline.errors import StepError, Violation
from pipeline.io import storage, writer
from pipeline.io.checksums import input_digest
from pipeline.io.discovery import SourceFile
from pipeline.io.storage import ObjectRoot
from pipeline.io.store_layout import attempt_of, attempts_prefix, manifest_key, output_key
from pipeline.manifest import Manifest, OutputFile, input_path
from pipeline.report import REPORT
from pipeline.settings import Settings
from pipeline.speed import thread_pool
from pipeline.step import TRAIN_BATCH, store_ranks
from pipeline.step.build import StageReporter, StepJob, run_step
from pipeline.step.freshness import shards_are_current
from pipeline.step.readers.shares import Tasks
from pipeline.step.tables import TrainBatch
from pipeline.step.verify import footer_rows, refuse_unverified, written_problems
from pipeline.transforms.layout import rank_bounds

# Files of an attempt no manifest names are removed once this old: a build writing its
# files, or a reader still reading a replaced step, is never cut short by another build.
ABANDONED_AFTER_S = 3600.0
ABANDONED_ENV = "ROLLOUT_SHARDS_ABANDONED_AFTER_S"
RACE_RULE = "step_committed_concurrently"
# PUTs of one step's files at once: each is a round trip, the bytes are already encoded.
UPLOADS = 8


def abandoned_after_s() -> float:
    return float(os.environ.get(ABANDONED_ENV, ABANDONED_AFTER_S))


def _encode(frame: pl.DataFrame) -> bytes:
    """A file's bytes as `writer.write_parquet` writes them to disk: the same options."""
    buffer = io.BytesIO()
    frame.write_parquet(buffer, **writer.PARQUET_OPTIONS)
    return buffer.getvalue()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def encode_step(batch: TrainBatch) -> tuple[Manifest, dict[str, bytes]]:
    """Every file of the step encoded in memory and the manifest that lists them, checked
    as a local build checks its staged folder (`written_problems`) before anything is
    sent: a step that fails a blocking check is never uploaded."""
    manifest = batch.meta.replace()
    bounds = rank_bounds(batch.ranks(), batch.meta.dp_size)
    files: dict[str, bytes] = {}
    footers: dict[str, int | str] = {}
    rank_rows: list[pl.LazyFrame] = []
    outputs = []

    def encode(rank: int) -> tuple[str, bytes, OutputFile]:
        part = batch.rows(bounds[rank], bounds[rank + 1] - bounds[rank])
        name, data = writer.rank_file(rank), _encode(part)
        tokens = int(part.get_column(c.TOTAL_LENGTHS).sum())
        record = OutputFile(
            name, _sha256(data), part.height, tokens, writer.raw_reward_sha256(part)
        )
        return name, data, record

    # Polars encodes and hashlib hashes without the GIL: two ranks at a time, as on disk
    with thread_pool(batch.parallel_ranks) as pool:
        for name, data, record in pool.map(encode, range(batch.meta.dp_size)):
            files[name] = data
            footers[name] = footer_rows(io.BytesIO(data))
            rank_rows.append(pl.scan_parquet(io.BytesIO(data)))
            outputs.append(record)
    if batch.quarantine is not None and batch.quarantine.height:
        # gathered into arrays of their own, as `write.commit_shards` writes it
        whole = batch.quarantine.select(pl.all().gather(pl.int_range(pl.len())))
        name, data = writer.quarantine_output(batch.step), _encode(whole)
        files[name] = data
        outputs.append(OutputFile(name, _sha256(data), batch.quarantine.height))
    manifest.outputs = outputs
    _verified(manifest, footers, rank_rows)
    return manifest, files


def _verified(
    manifest: Manifest, footers: dict[str, int | str], rank_rows: Sequence[pl.LazyFrame]
) -> None:
    """Refuse, before anything is sent, a step that fails a blocking check."""
    refuse_unverified(written_problems(manifest, footers, rank_rows), manifest.step)


def _upload_here(batch: TrainBatch) -> tuple[Manifest, store_ranks.Upload]:
    """The step encoded in this process, and the upload of its files from here."""
    manifest, files = encode_step(batch)

    def upload(root: ObjectRoot, attempt: str) -> list[str]:
        keys = [output_key(batch.step, attempt, name) for name in files]
        with thread_pool(UPLOADS) as pool:
            list(pool.map(storage.put, [root] * len(keys), keys, files.values()))
        return keys

    return manifest, upload


def _upload_by_tasks(batch: TrainBatch, tasks: Tasks) -> tuple[Manifest, store_ranks.Upload]:
    """The step encoded by `tasks` (a Ray cluster's), checked here on what they report."""
    manifest, footers, rank_rows, upload = store_ranks.encode_by_tasks(batch, tasks)
    _verified(manifest, footers, rank_rows)
    return manifest, upload


def _with_report(
    batch: TrainBatch, manifest: Manifest, upload: store_ranks.Upload
) -> store_ranks.Upload:
    """The step's report page drawn and listed last in the manifest's outputs, as
    `write.commit_shards` lists it on disk (so the manifests are the same bytes), and
    `upload` that also PUTs it."""
    page = report.render_step(batch.report_rows(), batch.meta, batch.quarantine)
    manifest.outputs = [*manifest.outputs, OutputFile(REPORT, _sha256(page), 0)]
    manifest.report = REPORT

    def with_page(root: ObjectRoot, attempt: str) -> list[str]:
        keys = upload(root, attempt)
        key = output_key(batch.step, attempt, REPORT)
        storage.put(root, key, page)
        return [*keys, key]

    return with_page


def _discard(root: ObjectRoot, step: int, attempt: str) -> None:
    """Remove what a failed upload left of `attempt`, unless the committed manifest names
    that attempt (the same step built again: its files are the committed ones)."""
    committed, _ = stored_manifest(root, step)
    if committed is not None and attempt_of(committed.to_json()) == attempt:
        return
    prefix = f"{attempts_prefix(step)}{attempt}/"
    storage.delete(root, [listed.key for listed in storage.listing(root, prefix)])


def commit_to_store(
    batch: TrainBatch, root: ObjectRoot, seen: str | None, tasks: Tasks | None = None
) -> Manifest:
    """Upload the step's files under its attempt prefix, then commit its manifest: created
    when the build found none (`seen` None), or replacing the version it found (`seen`,
    its etag). The files are encoded and PUT here, or by `tasks` (`store_ranks`). An upload
    that fails (a dead worker, the store) removes what it wrote. A build that loses the
    commit to another one removes its files and fails with one line, unless the manifest
    committed is byte for byte its own."""
    manifest, upload = _upload_here(batch) if tasks is None else _upload_by_tasks(batch, tasks)
    upload = _with_report(batch, manifest, upload)
    text = manifest.to_json().encode()
    attempt = attempt_of(text)
    step = batch.step
    try:
        keys = upload(root, attempt)
    except BaseException:
        with suppress(OSError):  # the upload's failure is the one to report
            _discard(root, step, attempt)
        raise
    if storage.put_if(root, manifest_key(step), text, seen):
        return manifest
    committed = storage.get(root, manifest_key(step))
    if committed is not None and committed.data == text:
        return manifest  # the same inputs and settings, built twice: one step, same files
    storage.delete(root, keys)
    raise StepError(
        [
            Violation(
                rule=RACE_RULE,
                message=f"another build committed {root.url(manifest_key(step))} while this "
                "one was writing the step; its step stands and this build's files were "
                "removed: build again to check it is current",
                step=step,
            )
        ]
    )


def stored_manifest(root: ObjectRoot, step: int) -> tuple[Manifest | None, str | None]:
    """The committed manifest of `step` (None when absent or of another shape: the step is
    rebuilt) and the etag of what is stored there (None when nothing is)."""
    stored = storage.get(root, manifest_key(step))
    if stored is None:
        return None, None
    try:
        return Manifest.from_json(stored.data), stored.etag
    except ValueError:
        return None, stored.etag


def files_there(root: ObjectRoot, manifest: Manifest) -> bool:
    """Every file the manifest lists is under its attempt prefix (one LIST)."""
    attempt = attempt_of(manifest.to_json())
    prefix = f"{attempts_prefix(manifest.step)}{attempt}/"
    present = {listed.key for listed in storage.listing(root, prefix)}
    return all(output_key(manifest.step, attempt, o.path) in present for o in manifest.outputs)


def current_in_store(
    manifest: Manifest | None, sources: Sequence[SourceFile], settings: Settings, root: ObjectRoot
) -> bool:
    """`freshness.current_manifest` for a stored step: the same inputs (paths, sha256,
    order) and settings, and every file it lists there."""
    if manifest is None:
        return False
    if [record.path for record in manifest.inputs] != [input_path(s.path) for s in sources]:
        return False
    checksums = [input_digest(source.path) for source in sources]
    return shards_are_current(manifest, checksums, settings) and files_there(root, manifest)


def clean_abandoned(root: ObjectRoot, step: int, keep: str | None) -> list[str]:
    """Remove the attempts of `step` that no manifest names (`keep` is the one the
    committed manifest names) and whose newest file is older than `abandoned_after_s`:
    a crashed build's, a lost race's, a replaced step's. The keys removed."""
    grace, now = abandoned_after_s(), datetime.now(UTC)
    by_attempt: dict[str, list[storage.Listed]] = {}
    for listed in storage.listing(root, attempts_prefix(step)):
        by_attempt.setdefault(listed.key.split("/")[2], []).append(listed)
    removed = [
        listed.key
        for attempt, items in by_attempt.items()
        if attempt != keep and all((now - i.modified).total_seconds() >= grace for i in items)
        for listed in items
    ]
    storage.delete(root, removed)
    return removed


def commit_step(batch: TrainBatch, root: ObjectRoot, tasks: Tasks | None = None) -> Manifest:
    """A planned step committed whether or not it was current (a Dagster materialization
    builds what it is asked to): the abandoned attempts of the step removed first, then the
    manifest found replaced, or created when there is none."""
    manifest, etag = stored_manifest(root, batch.step)
    clean_abandoned(root, batch.step, attempt_of(manifest.to_json()) if manifest else None)
    return commit_to_store(batch, root, etag, tasks)


def build_to_store(
    job: StepJob,
    root: ObjectRoot,
    force: bool,
    report: StageReporter,
    route: Callable[[StepJob], StepJob] | None,
) -> Manifest:
    """`build.build_step` of `job` to an object store: the one driver reads, checks and
    plans the step (`run_step`), then `commit_to_store` writes and commits it. A current
    step is kept unless `force`; abandoned attempts of the step are removed first. `route`
    may give the job Ray's tasks (`step/ray_route.py`), which then read the step and write
    its files."""
    step = job.step
    manifest, etag = stored_manifest(root, step)
    clean_abandoned(root, step, attempt_of(manifest.to_json()) if manifest else None)
    assert isinstance(job.settings, Settings), "a build has the batch's settings"
    if not force and current_in_store(manifest, job.sources, job.settings, root):
        assert manifest is not None
        report.up_to_date(step, root.url(f"step={step}"))
        return manifest
    if route is not None:
        job = route(job)
    batch = None
    for _, stage in run_step(job, last=TRAIN_BATCH, reporter=report):
        batch = stage
    assert isinstance(batch, TrainBatch)
    report.begin(step, "write")
    built = commit_to_store(batch, root, etag, job.tasks)
    report.end(step, "write", f"{len(built.outputs)} files")
    return built

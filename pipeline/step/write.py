"""Write one step: every rank file, the quarantine and the manifest, committed at once."""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Callable, Generator
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import NamedTuple

import polars as pl

from pipeline import columns as c
from pipeline import report, trainers
from pipeline.errors import StepError, Violation
from pipeline.io import writer
from pipeline.io.regular import read_regular
from pipeline.manifest import MANIFEST, Manifest
from pipeline.report import REPORT
from pipeline.speed import Background, Later, thread_pool, write_threads
from pipeline.step.one_trainer import RULE as ONE_TRAINER
from pipeline.step.one_trainer import other_trainer
from pipeline.step.tables import TrainBatch
from pipeline.step.verify import blocking_problems, footer_rows, refuse_unverified
from pipeline.transforms.layout import rank_bounds

# The output root's dataset card: `datasets.load_dataset(<root>)` reads every committed
# step's rank files through its `configs` (docs/dataset.md).
DATASET_CARD = "README.md"
RANK_FILES = "step=*/rank=*.parquet"


class RankFile(NamedTuple):
    """One written and sealed rank file of a staged step folder, as its manifest records it."""

    name: str
    rows: int
    tokens: int
    rewards: str  # `raw_reward_sha256` of its batch positions and raw rewards
    sha256: str
    footer: int | str  # the rows its footer says, or why it does not read as Parquet


def write_rank(batch: TrainBatch, rank: int, staged: Path) -> RankFile:
    """Write one rank's file of `batch` into the staged step folder and seal it: a writer
    that has the batch, or only this rank's rows of it, and no other rank (a Ray task of
    `pipeline/step/ray_ranks.py`)."""
    bounds = rank_bounds(batch.ranks(), batch.meta.dp_size)
    name, rows, tokens, rewards = _write_rank_file(batch, rank, bounds, staged)
    return RankFile(name, rows, tokens, rewards, *_seal_rank(staged / name))


def write_shards(batch: TrainBatch, out_root: Path) -> Manifest:
    """Write every rank file, the quarantine and the manifest, then commit the step folder."""
    dp = batch.meta.dp_size
    bounds = rank_bounds(batch.ranks(), dp)

    ranks_at_once, sealers = write_threads()

    def write_ranks(staged: Path) -> list[RankFile]:
        def write(rank: int) -> tuple[str, int, int, str, Later[tuple[str, int | str]]]:
            name, rows, tokens, rewards = _write_rank_file(batch, rank, bounds, staged)
            return name, rows, tokens, rewards, sealer.submit(_sealing_rank(staged / name))

        # Polars gathers and encodes, and hashlib hashes, without the GIL: two ranks at a
        # time keep two cores busy where one small file leaves one idle, and the sealers
        # seal each written file (its digest, fsync and footer) on the cores the writers
        # leave idle; once every rank is written, threads of the writers' priority seal
        # what is left. A file's bytes do not depend on the threads.
        with (
            thread_pool(min(ranks_at_once, batch.parallel_ranks)) as pool,
            Background(sealers) as sealer,
        ):
            written = list(pool.map(write, range(dp)))
            # what the sealers have not done yet, on as many threads of this priority
            with thread_pool(max(sealers, 1)) as finishing:
                seals = list(finishing.map(Later.result, [sealing for *_, sealing in written]))
            return [
                RankFile(name, rows, tokens, rewards, *sealed)
                for (name, rows, tokens, rewards, _), sealed in zip(written, seals, strict=True)
            ]

    return commit_shards(batch, out_root, write_ranks)


def commit_shards(
    batch: TrainBatch, out_root: Path, write_ranks: Callable[[Path], list[RankFile]]
) -> Manifest:
    """Commit the step folder whose rank files `write_ranks` writes into the staged folder
    it is given (every rank, in rank order), with the quarantine and the manifest, once the
    step passes its blocking checks."""
    manifest = batch.meta.replace()

    def fill(staged: Path) -> None:
        # the report is drawn on a thread of its own while the ranks are written (their
        # encoding and hashing leave the GIL free), from numbers the plan already holds;
        # with the writer's threads off, before the ranks on this thread
        with thread_pool(1) as drawer:
            drawing = _draw_report(batch, drawer if write_threads()[1] else None)
            written = write_ranks(staged)
            page = drawing.result()
        outputs = [
            writer.file_record(
                staged / rank.name, rank.name, rank.rows, rank.tokens, rank.sha256, rank.rewards
            )
            for rank in written
        ]
        footers = {rank.name: rank.footer for rank in written}
        quarantined = None
        if batch.quarantine is not None and batch.quarantine.height:
            quarantined = staged / writer.QUARANTINE
            # gathered into arrays of their own: Polars sizes a list column's pages by its
            # buffers, and a filter of the loaded step (a reward group set aside whole) may
            # be a slice of a file's whole buffer; the pages must be the rows' alone, the
            # same from every reader (the Ray shares gather theirs)
            whole = batch.quarantine.select(pl.all().gather(pl.int_range(pl.len())))
            writer.write_parquet(whole, quarantined)
            outputs.append(
                writer.file_record(
                    quarantined,
                    writer.quarantine_output(batch.step),
                    batch.quarantine.height,
                    sha256=writer.seal(quarantined),
                )
            )
        path = staged / REPORT
        path.write_bytes(page)
        outputs.append(writer.file_record(path, REPORT, 0, sha256=writer.seal(path)))
        manifest.report = REPORT
        manifest.outputs = outputs
        problems = blocking_problems(manifest, staged, hash_files=False, footers=footers)
        refuse_unverified(problems, batch.step)
        manifest.write(staged / MANIFEST)
        # The card's lock from here to the commit: no other build commits in between, so
        # the root's steps checked here are the ones this step is published beside.
        card.enter_context(writer.card_lock(out_root))
        trainer = str(manifest.settings.get("trainer", trainers.DEFAULT))
        if (mixed := other_trainer(out_root, trainer, batch.step)) is not None:
            raise StepError([Violation(rule=ONE_TRAINER, message=mixed, step=batch.step)])
        # from here to the end of the commit an interrupt waits: the step is published
        # whole (its quarantine, folder and card) or not at all
        card.enter_context(writer.commit_section())
        if quarantined is not None:
            # out of the staged folder and into place, just before the folder is swapped in
            published = writer.quarantine_path(out_root, batch.step)
            published.parent.mkdir(exist_ok=True)
            quarantined.rename(published)
            writer.fsync_folder(published.parent)
        # The card last before the commit, under its lock until the commit: a step is
        # published whole with a card naming it, or (the card failed, say on a full disk)
        # not at all, and a failure always means nothing of the step was written.
        build = next_build_id(out_root / DATASET_CARD, batch.step, manifest.to_json())
        writer.write_text_atomically(out_root / DATASET_CARD, dataset_card(build))

    out_root.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as card:
        writer.replace_folder(writer.step_folder(out_root, batch.step), fill)
        if not manifest.counts.quarantined:
            writer.quarantine_path(out_root, batch.step).unlink(missing_ok=True)
    return manifest


def _draw_report(batch: TrainBatch, drawer: Executor | None) -> Future[bytes]:
    """The step's report page being drawn on `drawer` (None: drawn here)."""
    rows = batch.report_rows()  # here: a gathered batch is not gathered twice at once
    if drawer is not None:
        return drawer.submit(report.render_step, rows, batch.meta, batch.quarantine)
    drawn: Future[bytes] = Future()
    drawn.set_result(report.render_step(rows, batch.meta, batch.quarantine))
    return drawn


def _write_rank_file(
    batch: TrainBatch, rank: int, bounds: list[int], staged: Path
) -> tuple[str, int, int, str]:
    """Write rank `rank`'s rows (`bounds` from the batch's rank column) to its file in
    `staged`: its name, rows, tokens and the digest of its raw rewards by batch position
    (`writer.raw_reward_sha256`, what the loader checks another rank's file by)."""
    part = batch.rows(bounds[rank], bounds[rank + 1] - bounds[rank])
    name = writer.rank_file(rank)
    writer.write_parquet(part, staged / name)
    tokens = int(part.get_column(c.TOTAL_LENGTHS).sum())
    return name, part.height, tokens, writer.raw_reward_sha256(part)


def _seal_rank(path: Path) -> tuple[str, int | str]:
    """A written rank file made durable: its sha256 and what its footer says (the check the
    step gets before it is published, read here while the writers are busy)."""
    return Later(_sealing_rank(path)).result()


def _sealing_rank(path: Path) -> Generator[None, None, tuple[str, int | str]]:
    """`_seal_rank` in steps (`writer.sealing`): a job of `speed.Background`."""
    digest = yield from writer.sealing(path)
    return digest, footer_rows(path)


# The build id in a card: what `next_build_id` reads back from the previous card.
BUILD_ID = re.compile(r"^  description: 'rollout-shards build ([0-9a-f]{16})", re.MULTILINE)


def next_build_id(card: Path, step: int, manifest_json: str) -> str:
    """The build id of the root once `step` is committed with this manifest: a digest of
    the previous card's id, the step and its manifest. `datasets` keys its cache of a
    local folder by the card's `configs`, never by the files they match; the id there
    changes with every commit, so a load never gets an earlier build's rows (of this root,
    or of another root of the same folder name)."""
    try:
        found = BUILD_ID.search(read_regular(card).decode(errors="replace"))
    except OSError:
        found = None
    previous = found.group(1) if found else ""
    digest = hashlib.sha256(f"{previous}\n{step}\n{manifest_json}".encode())
    return digest.hexdigest()[:16]


def dataset_card(build: str) -> str:
    """The output root's README.md: a `configs` entry whose data files are every step's
    rank files, with the root's build id (`next_build_id`) in its description, and what
    each column holds."""
    rows = "\n".join(
        f"| `{name}` | {dtype} | {c.DATASET_DESCRIPTIONS[name]} |"
        for name, dtype in c.DATASET_SCHEMA.items()
    )
    return f"""---
pretty_name: Training shards (rollout-shards)
license: other
tags:
- reinforcement-learning
- rollouts
configs:
- config_name: default
  description: 'rollout-shards build {build}: changes with every committed step, so that
    datasets never serves an earlier build from its cache'
  data_files:
  - split: train
    path: {RANK_FILES}
---
# Training shards

Written by rollout-shards: one folder per rollout step, `step=<N>/rank=<R>.parquet` per
data-parallel rank, rows in the order the rank trains on them, and `step=<N>/manifest.json`
(written last: a step without one is incomplete and is not a committed step). Every rank file
has the columns below; an optional column a step lacks is null there, and the step's
`manifest.json` lists those it has in `present_columns`. The step's rollout metrics are in its
manifest's `stats`. The license is that of the rollouts the shards were built from
(`license: other` until their owner says which; this card is written anew by every build).

| column | type | meaning |
|---|---|---|
{rows}
"""

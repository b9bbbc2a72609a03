"""Write one step: every rank file, the quarantine and the manifest, committed at once."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from pipeline import columns as c
from pipeline.errors import StepError, Violation
from pipeline.io import writer
from pipeline.manifest import MANIFEST, Manifest
from pipeline.step.tables import TrainBatch
from pipeline.step.verify import blocking_problems, footer_rows
from pipeline.transforms.layout import rank_bounds

# The output root's dataset card: `datasets.load_dataset(<root>)` reads every committed
# step's rank files through its `configs` (docs/dataset.md).
DATASET_CARD = "README.md"
RANK_FILES = "step=*/rank=*.parquet"

# Rank files written at once. Each holds one rank's gathered rows in memory; Polars
# already spreads one file's encoding over the cores it can use.
RANK_WRITERS = 2
# Threads that seal written rank files (sha256 from the page cache, fsync, footer). With
# one, the files written last waited for each other after the writers were done.
SEALERS = 2


def write_shards(batch: TrainBatch, out_root: Path) -> Manifest:
    """Write every rank file, the quarantine and the manifest, then commit the step folder."""
    dp = batch.meta.dp_size
    bounds = rank_bounds(batch.ranks(), dp)
    manifest = batch.meta.replace()

    def fill(staged: Path) -> None:
        def write_rank(rank: int) -> tuple[str, int, int, str, Future[tuple[str, int | str]]]:
            part = batch.rows(bounds[rank], bounds[rank + 1] - bounds[rank])
            name = writer.rank_file(rank)
            writer.write_parquet(part, staged / name)
            tokens = int(part.get_column(c.TOTAL_LENGTHS).sum())
            rewards = writer.raw_reward_sha256(part)
            return name, part.height, tokens, rewards, sealer.submit(_seal_rank, staged / name)

        # Polars gathers and encodes, and hashlib hashes, without the GIL: two ranks at a
        # time keep two cores busy where one small file leaves one idle, and the sealers
        # seal each written file (its digest, fsync and footer) while the writers go on
        # to the next ranks. A file's bytes do not depend on the threads.
        with (
            ThreadPoolExecutor(max_workers=RANK_WRITERS) as pool,
            ThreadPoolExecutor(max_workers=SEALERS) as sealer,
        ):
            outputs, footers = [], {}
            for name, rows, tokens, rewards, sealing in pool.map(write_rank, range(dp)):
                digest, footers[name] = sealing.result()
                outputs.append(
                    writer.file_record(staged / name, name, rows, tokens, digest, rewards)
                )
        quarantined = None
        if batch.quarantine is not None and batch.quarantine.height:
            quarantined = staged / writer.QUARANTINE
            writer.write_parquet(batch.quarantine, quarantined)
            outputs.append(
                writer.file_record(
                    quarantined,
                    writer.quarantine_output(batch.step),
                    batch.quarantine.height,
                    sha256=writer.seal(quarantined),
                )
            )
        manifest.outputs = outputs
        problems = blocking_problems(manifest, staged, hash_files=False, footers=footers)
        if problems:
            raise StepError(
                [
                    Violation(
                        rule="shards_verified",
                        message="the written step fails a blocking check and is not published: "
                        + "; ".join(f"{what}: {problem}" for what, problem in problems),
                        step=batch.step,
                    )
                ]
            )
        manifest.write(staged / MANIFEST)
        if quarantined is not None:
            # out of the staged folder and into place, just before the folder is swapped in
            published = writer.quarantine_path(out_root, batch.step)
            published.parent.mkdir(exist_ok=True)
            quarantined.rename(published)
            writer.fsync_folder(published.parent)

    # The card first: a step is published whole with its card, or (the card failed, say on
    # a full disk) not at all, and a failure always means nothing of the step was written.
    out_root.mkdir(parents=True, exist_ok=True)
    writer.write_text_atomically(out_root / DATASET_CARD, dataset_card())
    writer.replace_folder(writer.step_folder(out_root, batch.step), fill)
    if not manifest.counts.quarantined:
        writer.quarantine_path(out_root, batch.step).unlink(missing_ok=True)
    return manifest


def _seal_rank(path: Path) -> tuple[str, int | str]:
    """A written rank file made durable: its sha256 and what its footer says (the check the
    step gets before it is published, read here while the writers are busy)."""
    return writer.seal(path), footer_rows(path)


def dataset_card() -> str:
    """The output root's README.md: a `configs` entry whose data files are every step's
    rank files, and what each column holds. It names no step, so concurrent commits of
    different steps write the same card."""
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

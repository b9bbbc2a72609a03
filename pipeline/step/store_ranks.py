"""A step written to an object store by tasks (`--ray` with an `s3://` or `gs://` output).

`store_commit` names a step's files by its manifest's seal, which holds every file's
sha256: no file's key is known before every rank file is encoded. So the write is two
rounds of tasks, and the rank files' bytes never pass through the driver:

1. a task per rank encodes its file in memory (`encode_rank`; after the shuffle of
   `readers.shuffle`, `encode_rank_pieces`) and returns two pieces, kept where the task
   ran: what the manifest records of the file and the checks need (`EncodedRank`: its
   digest, rows, tokens, what its footer says, and the rows' rollout and train step when
   the blocking checks look at split rollouts), and the bytes. Only the records come to
   the driver (`brought`), which makes the manifest and runs the blocking checks on them,
   as `store_commit.encode_step` does on the files it encoded itself;
2. once the checks pass, a task per rank PUTs its bytes under the attempt prefix
   (`put_object`, from the object store of the cluster); the driver PUTs the quarantine,
   which it holds, and `store_commit` commits the manifest.

A task reaches the store with the standard environment (`AWS_*`, ...) of its worker, which
the driver hands the cluster when it joins it (`ray_ranks.connected`).
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from pipeline import columns as c
from pipeline.io import storage, writer
from pipeline.io.storage import ObjectRoot
from pipeline.io.store_layout import output_key
from pipeline.manifest import Manifest, OutputFile
from pipeline.step.readers.shares import Call, SourceRows, Tasks, rank_batch
from pipeline.step.readers.shuffle import destinations, split_share
from pipeline.step.tables import TrainBatch
from pipeline.step.verify import footer_rows
from pipeline.transforms.layout import rank_bounds

# upload(root, attempt): PUTs the step's files under that attempt, returns their keys
Upload = Callable[[ObjectRoot, str], list[str]]


def encode(frame: pl.DataFrame) -> bytes:
    """A file's bytes as `writer.write_parquet` writes them to disk: the same options."""
    buffer = io.BytesIO()
    frame.write_parquet(buffer, **writer.PARQUET_OPTIONS)
    return buffer.getvalue()


@dataclass(frozen=True)
class EncodedRank:
    """What the driver needs of one encoded rank file: its manifest record, what its
    footer says (`verify.footer_rows`) and, when the checks look for rollouts split across
    train steps (`cp_size`), its rows' rollout and train step."""

    record: OutputFile
    footer: int | str
    split: pl.DataFrame | None


def encode_rank(batch: TrainBatch, rank: int) -> list[Any]:
    """The task of a rank: its file encoded in memory from `batch` (that rank's rows, or
    the whole batch), as two pieces: its `EncodedRank` and its bytes."""
    bounds = rank_bounds(batch.ranks(), batch.meta.dp_size)
    part = batch.rows(bounds[rank], bounds[rank + 1] - bounds[rank])
    data = encode(part)
    tokens = int(part.get_column(c.TOTAL_LENGTHS).sum())
    digest = hashlib.sha256(data).hexdigest()
    record = OutputFile(
        writer.rank_file(rank), digest, part.height, tokens, writer.raw_reward_sha256(part)
    )
    split = None
    if batch.meta.settings.get("cp_size") is not None:  # read back from the bytes, as on disk
        split = pl.read_parquet(io.BytesIO(data), columns=[c.ROLLOUT_IDS, c.TRAIN_STEP])
    return [EncodedRank(record, footer_rows(io.BytesIO(data)), split), data]


def encode_rank_pieces(batch: TrainBatch, rank: int, held: list[int], *pieces: Any) -> list[Any]:
    """`encode_rank` from the pieces of the shares `held` names (`shuffle.split_share`),
    as `shuffle.write_rank_pieces` writes a file from them."""
    rows = batch.rank_rows
    assert isinstance(rows, SourceRows), "a rank of a step read in shares"
    frames = [pl.DataFrame(pl.from_arrow(piece)) for piece in pieces]
    rows.held = dict(zip(held, frames, strict=True))
    return encode_rank(batch, rank)


def brought(piece: Any) -> Any:
    """A task that brings one piece (an `EncodedRank`) to the driver, which `Tasks` hands
    only as arguments of other tasks."""
    return piece


def put_object(uri: str, key: str, data: bytes) -> None:
    """The task of a rank's upload: its bytes PUT at `key` of the root `uri`."""
    storage.put(ObjectRoot(uri), key, data)


def _encode_calls(batch: TrainBatch, tasks: Tasks) -> list[tuple[Call, int]]:
    """A call per rank, each returning its two pieces (`encode_rank`): after a shuffle of
    the lists by share when the step was read in shares, else from its rows whole."""
    dp = batch.meta.dp_size
    bounds = rank_bounds(batch.ranks(), dp)
    if not isinstance(batch.rank_rows, SourceRows):
        return [((encode_rank, (rank_batch(batch, rank, bounds), rank)), 2) for rank in range(dp)]
    shares, schema = batch.rank_rows.shares, batch.rank_rows.schema
    wanted = destinations(batch)
    ranks = {s: part.get_column(c.RANK).unique().sort().to_list() for s, part in wanted.items()}
    splits: list[tuple[Call, int]] = [
        ((split_share, (shares[s], part, schema, ranks[s])), len(ranks[s]))
        for s, part in wanted.items()
    ]
    handles = dict(zip(ranks, tasks.scatter(splits), strict=True))
    calls: list[tuple[Call, int]] = []
    for rank in range(dp):
        held = [share for share in handles if rank in ranks[share]]
        pieces = [handles[share][ranks[share].index(rank)] for share in held]
        arguments = (rank_batch(batch, rank, bounds), rank, held, *pieces)
        calls.append(((encode_rank_pieces, arguments), 2))
    return calls


def encode_by_tasks(
    batch: TrainBatch, tasks: Tasks
) -> tuple[Manifest, dict[str, int | str], list[pl.LazyFrame], Upload]:
    """Every rank file encoded by `tasks` (round 1), the quarantine here: the step's
    manifest, its rank files' footers and split rows for the blocking checks, and the
    upload of round 2, which the caller runs once the checks pass."""
    handles = tasks.scatter(_encode_calls(batch, tasks))
    ranks: Sequence[EncodedRank] = tasks.run([(brought, (pieces[0],)) for pieces in handles])
    manifest = batch.meta.replace()
    outputs = [rank.record for rank in ranks]
    quarantine: bytes | None = None
    if batch.quarantine is not None and batch.quarantine.height:
        # gathered into arrays of their own, as `write.commit_shards` writes it
        whole = batch.quarantine.select(pl.all().gather(pl.int_range(pl.len())))
        quarantine = encode(whole)
        digest = hashlib.sha256(quarantine).hexdigest()
        name = writer.quarantine_output(batch.step)
        outputs.append(OutputFile(name, digest, batch.quarantine.height))
    manifest.outputs = outputs
    footers = {rank.record.path: rank.footer for rank in ranks}
    rows = [rank.split.lazy() for rank in ranks if rank.split is not None]

    def upload(root: ObjectRoot, attempt: str) -> list[str]:
        keys = [output_key(batch.step, attempt, o.path) for o in manifest.outputs]
        calls: list[Call] = [
            (put_object, (root.uri, key, pieces[1]))
            for key, pieces in zip(keys[: len(handles)], handles, strict=True)
        ]
        if quarantine is not None:
            storage.put(root, keys[-1], quarantine)
        tasks.run(calls)
        return keys

    return manifest, footers, rows, upload

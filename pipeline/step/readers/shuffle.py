"""The write of a step read in shares (`readers.shares`): a shuffle, not a broadcast.

Once the step is planned, the driver knows, for every row it writes, its share, its row in
the input file and its rank; it holds no list. A task per share (`split_share`) decodes its
rows' lists once and splits them by destination rank, a piece per rank that writes any of
its rows; a task per rank (`write_rank_pieces`) receives only its pieces, in share order,
gathers them into training order and writes and seals its file. On a Ray cluster the pieces
stay in the object store between the two tasks (`ray_ranks.RayTasks.scatter`): they never
pass through the driver. A step costs one decode of its lists whatever `dp_size` is; a
rank task reading them from the input files instead would cost `dp_size` decodes.

The bytes are the in-process build's: a rank's writer gathers the rows the pieces hold as
it gathers them from the files (`shares.lists_at`), each piece being exactly the rows it
would have read of that share, in file order.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from pipeline import columns as c
from pipeline.columns import SOURCE_ROW
from pipeline.manifest import Manifest
from pipeline.step.readers.shares import (
    SHARE,
    Call,
    Share,
    SourceRows,
    Tasks,
    rank_batch,
    typed_parts,
)
from pipeline.step.tables import TrainBatch
from pipeline.step.write import RankFile, commit_shards, write_rank
from pipeline.transforms.layout import rank_bounds


def split_share(
    share: Share, wanted: pl.DataFrame, schema: dict[str, pl.DataType], ranks: list[int]
) -> list[pl.DataFrame]:
    """The task of a share in the shuffle: the lists (`schema`'s columns, typed as the read
    typed them) of the rows `wanted` names (SOURCE_ROW and RANK, sorted by rank then row),
    decoded once, as a piece per rank of `ranks` (ascending): that rank's rows in file
    order, as an Arrow table (Ray stores its buffers as they are and a rank task maps them
    from the object store, where a Polars frame is pickled whole and copied back)."""
    taken: list[pl.DataFrame] = []
    rows = wanted.get_column(SOURCE_ROW).unique().implode()

    def take(typed: pl.DataFrame) -> None:
        mine = typed.filter(pl.col(SOURCE_ROW).is_in(rows))
        if mine.height:
            taken.append(
                mine.select(
                    SOURCE_ROW,
                    *(
                        pl.col(n) if n in mine.columns else pl.lit(None, dtype=d).alias(n)
                        for n, d in schema.items()
                    ),
                )
            )

    typed_parts(share, take)
    held = pl.concat(taken) if taken else pl.DataFrame(schema={SOURCE_ROW: pl.Int64, **schema})
    # a row a rank writes twice is one row of its piece (the writer gathers it twice)
    placed = wanted.join(held, on=SOURCE_ROW, how="inner", maintain_order="left")
    pieces = placed.partition_by(c.RANK, maintain_order=True, as_dict=True, include_key=False)
    empty = held.clear().drop(SOURCE_ROW)
    return [
        (pieces[(rank,)].drop(SOURCE_ROW) if (rank,) in pieces else empty).to_arrow()
        for rank in ranks
    ]


def write_rank_pieces(
    batch: TrainBatch, rank: int, staged: Path, held: list[int], *pieces: Any
) -> RankFile:
    """The task of a rank in the shuffle: its file written from the pieces of the shares
    `held` names (ascending), one piece each (Arrow tables, taken as they are)."""
    rows = batch.rank_rows
    assert isinstance(rows, SourceRows), "a rank of a step read in shares"
    frames = [pl.DataFrame(pl.from_arrow(piece)) for piece in pieces]
    rows.held = dict(zip(held, frames, strict=True))
    return write_rank(batch, rank, staged)


def destinations(batch: TrainBatch) -> dict[int, pl.DataFrame]:
    """Per share (ascending) the rows its task splits: SOURCE_ROW and RANK of each row a
    rank writes, once per rank, sorted by rank then row."""
    rows = batch.rank_rows
    assert isinstance(rows, SourceRows), "a planned batch of a step read in shares"
    placed = rows.place[rows.order].with_columns(batch.ranks().cast(pl.Int64).alias(c.RANK))
    wanted = placed.unique().sort(SHARE, c.RANK, SOURCE_ROW)
    parts = wanted.partition_by(SHARE, maintain_order=True, as_dict=True, include_key=False)
    return {int(key[0]): part for key, part in parts.items()}


def write_by(tasks: Tasks) -> Callable[[TrainBatch, Path], Manifest]:
    """`write_shards` with each rank file written by a task of `tasks`: the lists shuffled
    from share tasks to rank tasks when the batch was read in shares, else each rank task
    given its rows whole."""

    def write(batch: TrainBatch, out_root: Path) -> Manifest:
        dp = batch.meta.dp_size
        bounds = rank_bounds(batch.ranks(), dp)
        if not isinstance(batch.rank_rows, SourceRows):

            def whole(staged: Path) -> list[RankFile]:
                calls: list[Call] = [
                    (write_rank, (rank_batch(batch, rank, bounds), rank, staged))
                    for rank in range(dp)
                ]
                return list(tasks.run(calls))

            return commit_shards(batch, out_root, whole)
        shares = batch.rank_rows.shares
        schema = batch.rank_rows.schema

        def shuffled(staged: Path) -> list[RankFile]:
            wanted = destinations(batch)
            ranks = {
                share: part.get_column(c.RANK).unique().sort().to_list()
                for share, part in wanted.items()
            }
            splits: list[tuple[Call, int]] = [
                ((split_share, (shares[share], part, schema, ranks[share])), len(ranks[share]))
                for share, part in wanted.items()
            ]
            del wanted
            handles = dict(zip(ranks, tasks.scatter(splits), strict=True))
            calls: list[Call] = []
            for rank in range(dp):
                held = [share for share in handles if rank in ranks[share]]
                pieces = [handles[share][ranks[share].index(rank)] for share in held]
                arguments: tuple[Any, ...] = (rank_batch(batch, rank, bounds), rank, staged, held)
                calls.append((write_rank_pieces, (*arguments, *pieces)))
            del handles  # the rank tasks hold their pieces from here
            return list(tasks.run(calls))

        return commit_shards(batch, out_root, shuffled)

    return write

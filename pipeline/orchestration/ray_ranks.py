"""One step's rank files written by Ray tasks: a step larger than one node (docs/scaling-out.md).

The driver (this process) reads, validates and plans the step as `rollout-shards build`
does, with the rank-bounded build (`pipeline.step.bounded`): the per-token lists go part by
part to a spill folder in the output root, which every node mounts at the same path. Then
each rank's file is written by a Ray task (`write.write_rank`) into the staged step folder,
from that rank's planned rows and its rows of the spilled parts alone; the driver gathers
what each task wrote, runs the step's blocking checks and commits the folder as
`write_shards` does (`write.commit_shards`). The files are byte-identical to the in-process
build's.

Ray is imported here and nowhere else in `pipeline` (the `ray` extra): the CLI and the
loader never import this module.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from pipeline.io.discovery import SourceFile
from pipeline.manifest import Manifest
from pipeline.settings import Settings
from pipeline.step.build import build_step
from pipeline.step.tables import TrainBatch
from pipeline.step.write import RankFile, commit_shards, write_rank
from pipeline.transforms.layout import rank_bounds


@dataclass(frozen=True)
class RankWriter:
    """Where a rank file was written: the Ray node's host name and the worker's process."""

    name: str
    host: str
    pid: int


@dataclass
class RayBuild:
    """A step built with Ray tasks: its manifest, and who wrote each rank file (none when
    the step was current and nothing was built)."""

    manifest: Manifest
    writers: list[RankWriter] = field(default_factory=list)


def build_step_on_ray(
    step: int,
    sources: Sequence[SourceFile],
    settings: Settings,
    out_root: Path,
    address: str | None = None,
    num_cpus: float = 1.0,
    force: bool = False,
    runtime_env: dict[str, Any] | None = None,
    timeout_s: float | None = None,
) -> RayBuild:
    """`build_step` with each rank file written by a Ray task on the cluster at `address`
    (its GCS, `head:6379`, what `ray start --address` takes; None: the cluster this
    process is connected to, else what `ray.init()` finds, `$RAY_ADDRESS` first). Each
    task reserves `num_cpus`; the step fails, nothing published, when its tasks have not
    all written their files `timeout_s` seconds after they were submitted (None: no bound).
    The lists go through the spill folder unless the step's input files take no more than
    the `stream_above` setting (null: never; the driver then holds the step and ships each
    rank its lists)."""
    connected = ray.is_initialized()
    if not connected:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
    writers: list[RankWriter] = []
    try:

        def write_on_ray(batch: TrainBatch, root: Path) -> Manifest:
            return commit_shards(
                batch,
                root,
                lambda staged: _ranks_on_ray(batch, staged, num_cpus, timeout_s, writers),
            )

        manifest = build_step(
            step,
            sources,
            settings,
            out_root,
            force=force,
            write_batch=write_on_ray,
        )
    finally:
        if not connected:
            ray.shutdown()
    return RayBuild(manifest, writers)


def _ranks_on_ray(
    batch: TrainBatch,
    staged: Path,
    num_cpus: float,
    timeout_s: float | None,
    writers: list[RankWriter],
) -> list[RankFile]:
    """Every rank file of `batch` written into `staged` by a Ray task of its own, in rank
    order. Ray runs a task again if its worker dies (the rank file is written anew, the
    same bytes); a task that fails, or the timeout, cancels the others and raises here; the
    staged folder is then removed (`writer.replace_folder`)."""
    dp = batch.meta.dp_size
    bounds = rank_bounds(batch.ranks(), dp)
    task = ray.remote(_write_one_rank).options(num_cpus=num_cpus)
    refs = [task.remote(rank_batch(batch, rank, bounds), rank, str(staged)) for rank in range(dp)]
    try:
        done: list[tuple[RankFile, str, int]] = ray.get(refs, timeout=timeout_s)
    except BaseException:
        for ref in refs:
            ray.cancel(ref, force=True)
        raise
    writers.extend(RankWriter(written.name, host, pid) for written, host, pid in done)
    return [written for written, _, _ in done]


def _write_one_rank(batch: TrainBatch, rank: int, staged: str) -> tuple[RankFile, str, int]:
    """The Ray task: one rank's file written and sealed, with where it ran."""
    return write_rank(batch, rank, Path(staged)), socket.gethostname(), os.getpid()


def rank_batch(batch: TrainBatch, rank: int, bounds: list[int]) -> TrainBatch:
    """What one rank's writer needs of `batch`: that rank's planned rows, and its lists, or
    where they wait (spill files the worker reads itself); no other rank's lists."""
    rows = batch.rank_rows
    assert rows is not None, "a planned batch holds its lists in batch order"
    mine = rows.for_rank(bounds[rank], bounds[rank + 1] - bounds[rank])
    return TrainBatch(batch.step, mine, batch.meta)

"""The least work a build keeping the contract does, as a process of its own: the lower bound
`bench/stage_profile.py` sets beside the I/O floor.

    python bench/least_build.py STEP_FILE OUT_FOLDER DP_SIZE

Like the floor (`bench/run.py _floor`) it reads the step with Polars and writes it with the
shards' Parquet options (`BENCH_PARQUET_OPTIONS`), but as a build must: the input's sha256
(on a second thread, beside the decode), `DP_SIZE` rank files written two at a time (each a
contiguous slice, the last one to the end: no check, no plan), each hashed back and
fsynced, then their folder. The whole step is held in memory, so no bounded build can do
less. Standard library and Polars only, as the floor.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import polars as pl


def sealed(path: Path) -> str:
    """The file's sha256, read back from the page cache, then the file fsynced."""
    with path.open("rb", buffering=0) as handle:
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
        os.fsync(handle.fileno())
    return digest


def main(source: str, out: str, dp_size: str) -> int:
    options = json.loads(os.environ["BENCH_PARQUET_OPTIONS"])
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    ranks = int(dp_size)
    with ThreadPoolExecutor(2) as pool:
        data = Path(source).read_bytes()
        input_digest = pool.submit(hashlib.sha256, data)  # releases the GIL as it hashes
        frame = pl.read_parquet(data)
        input_digest.result().hexdigest()
        del data
        per_rank = frame.height // ranks

        def write(rank: int) -> str:
            path = folder / f"rank={rank}.parquet"
            length = per_rank if rank < ranks - 1 else None  # the last rank: every row left
            frame.slice(rank * per_rank, length).write_parquet(path, **options)
            return sealed(path)

        list(pool.map(write, range(ranks)))
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))

"""A longer decay for Polars' allocator when a build or validate reads a large input.

Importing the package has Polars' jemalloc hand freed pages back to the system after
300 ms (`pipeline.ALLOCATOR_CONF`), which keeps a 32k-sample build's peak down. A step of
several hundred MiB writes each rank for longer than that: the buffers a rank gathered and
freed are handed back before the next rank on that thread allocates as much again, and
every page of it faults in anew. For inputs of `LARGE_INPUT_BYTES` or more freed pages
stay 2 s (`LARGE_INPUT_DECAY`): at 128k samples (585-593 MiB) builds faulted 20-24% less
(642k -> 487k, 638k -> 509k), used 0.2-0.45 s less system CPU and took 0.948x and 0.970x
the time (faster in 4 and 3 of 5 rounds), for a peak 2-6% higher (docs/performance.md).
The threads share one arena here too (`pipeline.ALLOCATOR_SHARING`): at 128k the same
time (1.014x, 6 rounds) for a peak of 1543 MiB instead of 1705.

jemalloc reads `_RJEM_MALLOC_CONF` when Polars loads, so this runs before the first
`import polars`; a process that already loaded it, or a setting of the user's, is left as
it is. Standard library only: the command line calls it before anything heavy.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pipeline import ALLOCATOR_CONF, ALLOCATOR_ENV, ALLOCATOR_SHARING
from pipeline.io.checksums import table_files

LARGE_INPUT_BYTES = 256 << 20
LARGE_INPUT_DECAY = f"dirty_decay_ms:2000,muzzy_decay_ms:0,{ALLOCATOR_SHARING}"
# The walk stops after this many files: a tree of many small files is not one large step.
WALK_LIMIT = 2000


def longer_decay_for_large_inputs(inputs: Sequence[str | Path]) -> None:
    """Keep freed pages 2 s when the table files under `inputs` hold `LARGE_INPUT_BYTES`
    or more, unless Polars is loaded or the user set the allocator."""
    if "polars" in sys.modules or os.environ.get(ALLOCATOR_ENV) != ALLOCATOR_CONF:
        return
    total = 0
    for count, path in enumerate(table_files(inputs)):
        if count >= WALK_LIMIT:
            return
        try:
            total += path.stat().st_size
        except OSError:  # the build names what is wrong with the file
            continue
        if total >= LARGE_INPUT_BYTES:
            os.environ[ALLOCATOR_ENV] = LARGE_INPUT_DECAY
            return

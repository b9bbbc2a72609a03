"""rollout-shards: validated training shards from RL rollout sample tables.

Importing the package sets how soon Polars' allocator (jemalloc) hands freed memory back
to the system, unless the user set it or Polars is already loaded. Polars keeps freed pages
for 0.5 s, then 1 s more as lazily freed pages that still count as resident
(`dirty_decay_ms:500,muzzy_decay_ms:1000`, which it writes to `_RJEM_MALLOC_CONF` on import,
appending that variable's value). A build frees the step's decoded pages and each gathered
rank within a second of allocating them, so with those defaults a fast build's peak holds
much of what it freed: 612-651 MiB at 32k samples against 523-526 MiB with 300 ms and no
lazy stage, for the same wall and CPU time (15 rounds interleaved; 100 ms gave 508 MiB for
2.5% more CPU, each rank's buffers faulted in again; docs/performance.md).

All threads also share one arena, for every size (`narenas:1,oversize_threshold:0`). By
default jemalloc gives each thread an arena of its own and serves every allocation over
8 MiB from a separate arena that hands its pages back at once, so the buffers a rank
gathers never reused what the read freed (the Parquet column chunks, 150 MiB at 32k) nor
what the previous rank freed: each came as fresh pages, and every fresh page costs a
fault and a zeroing, which this virtual machine pays dearly. Sharing, a 32k build faulted
138k pages instead of 158k, took 0.975x the time (faster in 15 of 24 rounds) and peaked at
451 MiB instead of 487; 8k 0.976x (13 of 20), 32k compact 0.977x (10 of 16)
(docs/performance.md).

It also keeps numpy's OpenBLAS to one thread, unless the user set `OPENBLAS_NUM_THREADS` or
numpy is already loaded. The package calls no BLAS routine, but OpenBLAS starts a thread per
core when numpy loads and that thread spins while a build decodes: at 32k samples a build
took 1.19 s and 1.98 cpu-s with it, 1.15 s and 1.92 cpu-s without (8 rounds interleaved).
"""

import os
import sys

ALLOCATOR_ENV = "_RJEM_MALLOC_CONF"
ALLOCATOR_SHARING = "narenas:1,oversize_threshold:0"
ALLOCATOR_CONF = f"dirty_decay_ms:300,muzzy_decay_ms:0,{ALLOCATOR_SHARING}"

BLAS_THREADS_ENV = "OPENBLAS_NUM_THREADS"

if "polars" not in sys.modules:
    os.environ.setdefault(ALLOCATOR_ENV, ALLOCATOR_CONF)
if "numpy" not in sys.modules:
    os.environ.setdefault(BLAS_THREADS_ENV, "1")

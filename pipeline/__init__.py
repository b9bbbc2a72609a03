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

It also keeps numpy's OpenBLAS to one thread, unless the user set `OPENBLAS_NUM_THREADS` or
numpy is already loaded. The package calls no BLAS routine, but OpenBLAS starts a thread per
core when numpy loads and that thread spins while a build decodes: at 32k samples a build
took 1.19 s and 1.98 cpu-s with it, 1.15 s and 1.92 cpu-s without (8 rounds interleaved).
"""

import os
import sys

ALLOCATOR_ENV = "_RJEM_MALLOC_CONF"
ALLOCATOR_DECAY = "dirty_decay_ms:300,muzzy_decay_ms:0"

BLAS_THREADS_ENV = "OPENBLAS_NUM_THREADS"

if "polars" not in sys.modules:
    os.environ.setdefault(ALLOCATOR_ENV, ALLOCATOR_DECAY)
if "numpy" not in sys.modules:
    os.environ.setdefault(BLAS_THREADS_ENV, "1")

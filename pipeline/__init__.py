"""rollout-shards: validated training shards from RL rollout sample tables.

Importing the package sets how Polars' allocator (jemalloc) reuses freed memory, unless the
user set it or Polars is already loaded (`ALLOCATOR_CONF`, which Polars appends to its own
`dirty_decay_ms:500,muzzy_decay_ms:1000` when it loads, so ours wins):

- All threads share one arena, for every size (`narenas:1,oversize_threshold:0`). By
  default each thread has an arena of its own, and every allocation over 8 MiB comes from a
  separate arena that hands its pages back at once. A build's rank gathers then never
  reused what the read freed (the Parquet column chunks, 150 MiB at 32k samples) nor the
  previous rank's buffers: each was fresh pages, and every fresh page costs a fault and a
  zeroing, which a virtual machine such as the benchmark's pays dearly.
- Freed pages are kept 2 s (`dirty_decay_ms:2000`), then handed back without a lazy stage
  (`muzzy_decay_ms:0`). At 32k the validation and the plan take 0.1-0.25 s between the read
  and the first gathers: with 300 ms most of what the read freed had been handed back by
  then, and the first two ranks' gathers faulted 14k pages each and took 36-37 ms, against
  30 faults and 16-17 ms.

Against 300 ms without sharing, a 32k build took 0.975x the time with sharing (faster in 15
of 24 rounds, 487 -> 451 MiB) and 0.977x again with 2 s (12 of 16, 134k -> 121k faults,
504 MiB); 8k 0.976x (13 of 20) with sharing; 128k, which had 2 s already, 1.014x (2 of 6)
with a peak of 1543 MiB instead of 1705 (docs/performance.md).

It also keeps numpy's OpenBLAS to one thread, unless the user set `OPENBLAS_NUM_THREADS` or
numpy is already loaded. The package calls no BLAS routine, but OpenBLAS starts a thread per
core when numpy loads and that thread spins while a build decodes: at 32k samples a build
took 1.19 s and 1.98 cpu-s with it, 1.15 s and 1.92 cpu-s without (8 rounds interleaved).
"""

import os
import sys

ALLOCATOR_ENV = "_RJEM_MALLOC_CONF"
ALLOCATOR_CONF = "dirty_decay_ms:2000,muzzy_decay_ms:0,narenas:1,oversize_threshold:0"

BLAS_THREADS_ENV = "OPENBLAS_NUM_THREADS"

if "polars" not in sys.modules:
    os.environ.setdefault(ALLOCATOR_ENV, ALLOCATOR_CONF)
if "numpy" not in sys.modules:
    os.environ.setdefault(BLAS_THREADS_ENV, "1")

"""rollout-shards: validated training shards from RL rollout sample tables.

Importing the package sets how soon Polars' allocator (jemalloc) hands freed memory back
to the system, unless the user set it or Polars is already loaded: Polars keeps freed pages
for 0.5 s, then 1 s more (`dirty_decay_ms:500,muzzy_decay_ms:1000`, which it writes to
`_RJEM_MALLOC_CONF` on import and to which it appends that variable's value). A build frees
each gathered rank and each decoded page within a second of allocating it, so with those
defaults a fast build's peak holds every buffer it ever freed: 670 MiB at 32k samples
against 545 MiB with 100 ms and no muzzy stage, for the same CPU time (docs/performance.md).
"""

import os
import sys

ALLOCATOR_ENV = "_RJEM_MALLOC_CONF"
ALLOCATOR_DECAY = "dirty_decay_ms:100,muzzy_decay_ms:0"

if "polars" not in sys.modules:
    os.environ.setdefault(ALLOCATOR_ENV, ALLOCATOR_DECAY)

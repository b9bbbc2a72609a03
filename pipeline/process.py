"""Process-wide settings a build wants, set by the programs that run builds (the CLI's
`main` and the Pipes worker), never by importing the package: a trainer or a notebook that
imports `pipeline` keeps its own allocator and BLAS settings.

- Polars' allocator (jemalloc, read once when Polars loads): every thread shares one arena
  for every size, so a rank's gathered lists reuse the pages the read and earlier ranks
  freed instead of faulting in fresh ones, and freed pages are kept a while before they go
  back to the system, long enough to outlast the validation and the plan between the read
  and the first rank's gather.
- numpy's OpenBLAS: one thread. The package calls no BLAS routine, but OpenBLAS starts a
  spinning thread per core when numpy loads, which competes with Polars' decoders.

A value the user set is kept, and nothing changes once the library it concerns is loaded.
"""

from __future__ import annotations

import os
import sys

ALLOCATOR_ENV = "_RJEM_MALLOC_CONF"
ALLOCATOR_CONF = "dirty_decay_ms:2000,muzzy_decay_ms:0,narenas:1,oversize_threshold:0"
BLAS_THREADS_ENV = "OPENBLAS_NUM_THREADS"


def tune_process() -> None:
    """Set the allocator and BLAS settings for this process, before Polars and numpy load."""
    if "polars" not in sys.modules:
        os.environ.setdefault(ALLOCATOR_ENV, ALLOCATOR_CONF)
    if "numpy" not in sys.modules:
        os.environ.setdefault(BLAS_THREADS_ENV, "1")

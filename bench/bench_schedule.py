"""Time the rollout-side schedule and the balanced split on a large synthetic batch.

Run from the project root:
    .venv/bin/python -m bench.bench_schedule [--rows N] [--repeat R] [--seed S]

Prints one line per scenario with the best and median wall time over the repeats, the
number of train steps, and the micro-batches each rank trains summed over the steps.
The target is well under one second for 100k rows.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from pipeline.trainers.miles.schedule import balanced_rank_partitions, rollout_schedule


@dataclass(frozen=True)
class BenchSettings:
    global_batch_size: int
    dp_size: int = 8
    micro_batch_size: int | None = None
    use_dynamic_batch_size: bool = True
    max_tokens_per_gpu: int | None = 16384
    cp_size: int | None = 1
    vpp_size: int | None = None
    microbatch_group_size_per_vp_stage: int | None = None
    allow_partial_train_step: bool = False
    balance_data: bool = False


def synthetic_batch(n_rows: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Rollout keys and total lengths: most rollouts single-leaf, some with 2 to 8 leaves,
    siblings interleaved a little as concurrent generate calls finish out of order."""
    leaves = np.where(rng.random(n_rows) < 0.75, 1, rng.integers(2, 9, n_rows))
    leaves = leaves[np.cumsum(leaves) <= n_rows]
    leaves = np.append(leaves, n_rows - leaves.sum()).astype(np.int64)
    leaves = leaves[leaves > 0]
    keys = np.repeat(np.arange(len(leaves), dtype=np.int64) * 7 + 3, leaves)
    nudge = np.arange(n_rows) + rng.integers(0, 4, n_rows)
    keys = keys[np.argsort(nudge, kind="stable")]
    prompt = rng.integers(200, 2000, n_rows)
    response = np.minimum(rng.lognormal(7.0, 1.0, n_rows).astype(np.int64), 30000)
    return keys, prompt + response


def timings(run: Callable[[], object], repeat: int) -> list[float]:
    run()
    seconds = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - start)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    keys, lengths = synthetic_batch(args.rows, np.random.default_rng(args.seed))
    n_rollouts = len(np.unique(keys))
    print(
        f"{args.rows} rows, {n_rollouts} rollouts, "
        f"median length {int(np.median(lengths))}, max {int(lengths.max())}"
    )

    single_keys = np.arange(args.rows, dtype=np.int64)
    dynamic = BenchSettings(global_batch_size=n_rollouts // 100)
    static = replace(
        dynamic,
        use_dynamic_batch_size=False,
        max_tokens_per_gpu=None,
        micro_batch_size=1,
    )
    scenarios: dict[str, Callable[[], object]] = {
        "dynamic, 100 steps, dp 8": lambda: rollout_schedule(keys, lengths, dynamic),
        "dynamic + balance_data": lambda: rollout_schedule(
            keys, lengths, replace(dynamic, balance_data=True)
        ),
        "dynamic, vpp 2 x group 4, cp 2": lambda: rollout_schedule(
            keys,
            lengths,
            replace(dynamic, cp_size=2, vpp_size=2, microbatch_group_size_per_vp_stage=4),
        ),
        "dynamic, one step of all rollouts": lambda: rollout_schedule(
            keys, lengths, replace(dynamic, global_batch_size=n_rollouts)
        ),
        "static, micro_batch_size 1, dp 1": lambda: rollout_schedule(
            keys, lengths, replace(static, dp_size=1)
        ),
        "static + balance_data, dp 1": lambda: rollout_schedule(
            keys, lengths, replace(static, dp_size=1, balance_data=True)
        ),
        "static, single-leaf, mbs 4, dp 8": lambda: rollout_schedule(
            single_keys, lengths, replace(static, global_batch_size=1024, micro_batch_size=4)
        ),
        "plain balanced split, dp 8": lambda: balanced_rank_partitions(
            lengths[: len(lengths) // 8 * 8], 8
        ),
    }
    print(f"{'scenario':<36} {'best s':>8} {'median s':>9} {'steps':>6} {'mb/rank':>8}")
    for name, run in scenarios.items():
        seconds = timings(run, args.repeat)
        layout = run()
        steps = len(layout.num_rollouts) if hasattr(layout, "num_rollouts") else "-"
        per_rank = sum(layout.num_microbatches) if hasattr(layout, "num_microbatches") else "-"
        print(
            f"{name:<36} {min(seconds):>8.3f} {statistics.median(seconds):>9.3f} "
            f"{steps:>6} {per_rank:>8}"
        )


if __name__ == "__main__":
    main()

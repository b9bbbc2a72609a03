"""Model (d) of the benchmark: the common path as a data engineer would first write it, in
DuckDB SQL.

The non-compact path of `rollout-shards build` without its checks: trim to whole optimizer
batches, convert to shard columns, GRPO rewards (per prompt group, one value per rollout,
mean-centred and divided by the Bessel std + 1e-6), and the strided split (each train
step's G rows cut into dp micro-batches of G/dp rows, micro-batch m to rank m % dp). One
Parquet file per rank, zstd like the pipeline. DuckDB computes in float64 where miles uses
torch float32, so rewards agree to about 1e-7, not bit for bit: a yardstick for
`rollout-shards build`, not a second implementation (no validation, no manifest, no
atomic commit).

    python bench/duckdb_path.py INPUT_DIR --out DIR --global-batch-size G --dp-size D
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import duckdb

SHARDS = """
WITH batch AS (
    SELECT *, row_number() OVER () - 1 AS batch_position
    FROM read_parquet($source, file_row_number = true)
    ORDER BY file_row_number
),
kept AS (
    SELECT * FROM batch
    WHERE batch_position < (SELECT (count(*) // $gbs) * $gbs FROM batch)
),
rollouts AS (
    SELECT group_index, coalesce(rollout_id, "index") AS rollout, any_value(reward) AS r
    FROM kept
    GROUP BY ALL
),
normalized AS (
    SELECT
        group_index,
        rollout,
        CASE
            WHEN count(*) OVER g < 2 THEN 0.0
            WHEN stddev_samp(r) OVER g > 0
                THEN (r - avg(r) OVER g) / (stddev_samp(r) OVER g + 1e-6)
            ELSE r - avg(r) OVER g
        END AS reward
    FROM rollouts
    WINDOW g AS (PARTITION BY group_index)
),
columns AS (
    SELECT
        k.batch_position,
        (k.batch_position // $gbs)::INTEGER AS train_step,
        ((k.batch_position % $gbs) // ($gbs // $dp))::INTEGER AS micro_batch,
        k.tokens,
        k.response_length AS response_lengths,
        len(k.tokens)::INTEGER AS total_lengths,
        CASE
            WHEN k.remove_sample
                THEN list_transform(range(k.response_length), lambda x: 0::TINYINT)
            ELSE coalesce(
                k.loss_mask, list_transform(range(k.response_length), lambda x: 1::TINYINT)
            )
        END AS loss_masks,
        n.reward AS rewards,
        k.reward AS raw_reward,
        (k.status = 'truncated')::TINYINT AS truncated,
        k."index" AS sample_indices,
        coalesce(k.rollout_id, k."index") AS rollout_ids,
        k.rollout_log_probs
    FROM kept k
    JOIN normalized n
        ON n.group_index IS NOT DISTINCT FROM k.group_index
        AND n.rollout = coalesce(k.rollout_id, k."index")
)
SELECT
    * EXCLUDE (rollout_log_probs),
    sum(list_sum(loss_masks)) OVER (PARTITION BY rollout_ids) AS rollout_mask_sums,
    rollout_log_probs,
    (micro_batch % $dp) AS rank
FROM columns
ORDER BY rank, train_step, micro_batch, batch_position
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--global-batch-size", type=int, default=256)
    parser.add_argument("--dp-size", type=int, default=8)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    sources = sorted(str(path) for path in args.input.glob("step=*.parquet"))
    if not sources:
        raise SystemExit(f"no step=<N>.parquet under {args.input}")
    connection = duckdb.connect()
    for source in sources:
        step = Path(source).stem.removeprefix("step=")
        folder = args.out / f"step={step}"
        folder.mkdir(parents=True, exist_ok=True)
        shards = connection.sql(
            SHARDS, params={"source": source, "gbs": args.global_batch_size, "dp": args.dp_size}
        )
        shards.create_view("shards", replace=True)
        # One file per rank: rank=<r>/data_0.parquet, the rank a folder name as Hive writes it.
        connection.execute(
            f"COPY shards TO '{folder}' (FORMAT parquet, PARTITION_BY (rank), "
            "COMPRESSION zstd, OVERWRITE_OR_IGNORE)"
        )
    print(f"duckdb path: {len(sources)} steps in {time.perf_counter() - started:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Model (c) of the benchmark: the trainer's in-process conversion, one Python dict per sample.

For each step file under INPUT_DIR (`step=<N>.parquet`, or `step=<N>/*.parquet` read in
path order): read it with pyarrow, turn it into one dict per sample (`to_pylist`, as
miles holds `Sample` objects), run the naive reference of tests/reference.py (loops over
samples, as miles' `convert_samples_to_train_data` and `split_train_data_by_dp`), and
write one Parquet file per data-parallel rank with pyarrow. It is a yardstick for
`rollout-shards build`, not a second implementation: no manifest, no atomic commit.

    python bench/miles_path.py INPUT_DIR --out DIR --global-batch-size G --dp-size D
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

REFERENCE_PATH = Path(__file__).resolve().parent.parent / "tests" / "reference.py"
STEP_NAME = re.compile(r"^step=(\d+)(?:\.parquet)?$")

SHARD_FIELDS = [
    pa.field("batch_position", pa.int64()),
    pa.field("train_step", pa.int32()),
    pa.field("micro_batch", pa.int32()),
    pa.field("tokens", pa.list_(pa.int32())),
    pa.field("response_lengths", pa.int32()),
    pa.field("total_lengths", pa.int32()),
    pa.field("loss_masks", pa.list_(pa.int8())),
    pa.field("rewards", pa.float64()),
    pa.field("raw_reward", pa.float64()),
    pa.field("truncated", pa.int8()),
    pa.field("sample_indices", pa.int64()),
    pa.field("rollout_ids", pa.int64()),
    pa.field("rollout_mask_sums", pa.int64()),
]
OPTIONAL_SHARD_FIELDS = [
    pa.field("rollout_log_probs", pa.list_(pa.float32())),
    pa.field("teacher_log_probs", pa.list_(pa.float32())),
    pa.field("weight_versions", pa.list_(pa.string())),
    pa.field("round_number", pa.int64()),
    pa.field("metadata", pa.string()),
]


def load_reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rollout_shards_reference", REFERENCE_PATH)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {REFERENCE_PATH}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def find_steps(input_dir: Path) -> dict[int, list[Path]]:
    steps: dict[int, list[Path]] = {}
    for path in sorted(input_dir.iterdir()):
        match = STEP_NAME.match(path.name)
        if match is None:
            continue
        files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
        steps.setdefault(int(match.group(1)), []).extend(files)
    return dict(sorted(steps.items()))


def read_samples(files: list[Path]) -> list[dict[str, Any]]:
    samples: list[dict[str, Any]] = []
    for path in files:
        samples.extend(pq.read_table(path).to_pylist())
    return samples


def shard_schema(rows: list[dict[str, Any]]) -> pa.Schema:
    present = rows[0].keys() if rows else ()
    return pa.schema(SHARD_FIELDS + [f for f in OPTIONAL_SHARD_FIELDS if f.name in present])


def write_ranks(ranks: list[list[dict[str, Any]]], step_dir: Path, compression: str) -> list[Path]:
    step_dir.mkdir(parents=True, exist_ok=True)
    schema = shard_schema([row for rank in ranks for row in rank[:1]])
    paths = []
    for rank, rows in enumerate(ranks):
        path = step_dir / f"rank={rank}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, compression=compression)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input_dir", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--global-batch-size", type=int, required=True)
    parser.add_argument("--dp-size", type=int, default=1)
    parser.add_argument("--use-dynamic-global-batch-size", action="store_true")
    parser.add_argument("--disable-rollout-trim-samples", action="store_true")
    parser.add_argument("--advantage-estimator", default="grpo")
    parser.add_argument("--disable-rewards-normalization", action="store_true")
    parser.add_argument("--disable-grpo-std-normalization", action="store_true")
    parser.add_argument("--reward-key")
    parser.add_argument("--n-samples-per-prompt", type=int)
    parser.add_argument("--rollout-batch-size", type=int)
    parser.add_argument("--compression", default="snappy", help="Parquet codec of the shards")
    args = parser.parse_args(argv)

    settings = {
        "global_batch_size": args.global_batch_size,
        "dp_size": args.dp_size,
        "use_dynamic_global_batch_size": args.use_dynamic_global_batch_size,
        "disable_rollout_trim_samples": args.disable_rollout_trim_samples,
        "advantage_estimator": args.advantage_estimator,
        "rewards_normalization": not args.disable_rewards_normalization,
        "grpo_std_normalization": not args.disable_grpo_std_normalization,
        "reward_key": args.reward_key,
        "n_samples_per_prompt": args.n_samples_per_prompt,
        "rollout_batch_size": args.rollout_batch_size,
    }
    reference = load_reference()
    steps = find_steps(args.input_dir)
    if not steps:
        print(f"no step=<N> files under {args.input_dir}", file=sys.stderr)
        return 1
    for step, files in steps.items():
        t0 = time.perf_counter()
        samples = read_samples(files)
        t1 = time.perf_counter()
        try:
            result = reference.reference_build(samples, settings)
        except ValueError as error:
            print(f"step {step}: {error}", file=sys.stderr)
            return 1
        t2 = time.perf_counter()
        del samples
        write_ranks(result["ranks"], args.out / f"step={step}", args.compression)
        t3 = time.perf_counter()
        written = sum(len(rank) for rank in result["ranks"])
        print(
            f"step {step}: {written} rows written, {result['trimmed']} trimmed, "
            f"{len(result['ranks'])} ranks; read+to_pylist {t1 - t0:.1f} s, "
            f"convert {t2 - t1:.1f} s, write {t3 - t2:.1f} s",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

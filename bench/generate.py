"""Realistic rollout steps at a chosen size, for benchmarks (CONTRACT section 1 schema).

Every column is built from flat numpy arrays and offsets, never from Python lists per
token, so a 30M-token step takes a few seconds. The batch is a sequence of prompt
groups of `--group-size` generate calls each; a group is one kind:

- grpo: plain GRPO samples, one row per call, no session server, null loss masks;
- v1: agentic rows from session v1 (one leaf per call, explicit masks with a masked
  tool-output span);
- v2: session v2 calls returning 1 to 4 leaves; the leaves of a multi-leaf call share
  the call's index and carry it as rollout_id (miles PR #2536), a single leaf keeps it
  null;
- v2single: session v2 calls that each return one leaf.

Siblings share the trajectory's reward. With `--non-compact` there are no v2 groups,
so no row carries a rollout_id and the batch is trimmed by row count.

    python bench/generate.py --samples 32768 --mean-tokens 950 --out DIR --steps 1
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

KINDS = ("grpo", "v1", "v2", "v2single")
SESSION_VERSIONS = pa.array([None, "v1", "v2", "v2"], pa.string())
STATUSES = pa.array(["completed", "truncated", "aborted"], pa.string())
DEFAULT_MIX = "grpo=0.4,v1=0.2,v2=0.3,v2single=0.1"
V2_LEAVES = np.array([1, 2, 3, 4])
V2_LEAF_WEIGHTS = np.array([0.2, 0.35, 0.3, 0.15])
VOCAB_SIZE = 151_936
INDEX_STRIDE = 10_000_000


def parse_mix(text: str, non_compact: bool) -> np.ndarray:
    weights = dict.fromkeys(KINDS, 0.0)
    for part in text.split(","):
        name, _, value = part.partition("=")
        if name.strip() not in weights:
            raise SystemExit(f"unknown kind {name!r} in --mix; known: {', '.join(KINDS)}")
        weights[name.strip()] = float(value)
    if non_compact:
        weights["v2"] = 0.0
    p = np.array([weights[k] for k in KINDS])
    if p.sum() <= 0:
        raise SystemExit("--mix leaves no kind with a positive weight")
    return p / p.sum()


def lognormal(rng: np.random.Generator, mean: float, sigma: float, size: int) -> np.ndarray:
    return rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, size)


def list_array(lengths: np.ndarray, values: pa.Array, null: np.ndarray | None = None) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise SystemExit("a list column over 2**31 values needs large_list; make the step smaller")
    mask = None if null is None else pa.array(null)
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values, mask=mask)


def span_mask(lengths: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Flat int8 values of lists of `lengths` ones with [start, end) of each list zeroed."""
    offsets = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    total = int(lengths.sum())
    start = np.minimum(start, lengths) + offsets
    end = np.minimum(end, lengths) + offsets
    depth = np.bincount(end, minlength=total + 1) - np.bincount(start, minlength=total + 1)
    return (np.cumsum(depth[:total]) >= 0).astype(np.int8)


def generate_step(
    step: int,
    samples: int,
    mean_tokens: float,
    mix: np.ndarray,
    group_size: int,
    prompt_share: float,
    seed: int,
    log_probs: bool,
) -> pa.Table:
    rng = np.random.default_rng([seed, step])

    # trajectories: group_size generate calls per prompt group, enough for `samples` rows
    n_groups = -(-samples // group_size)
    group_kind = rng.choice(len(KINDS), n_groups, p=mix)
    traj_group = np.repeat(np.arange(n_groups), group_size)
    traj_kind = group_kind[traj_group]
    leaves = np.ones(len(traj_group), dtype=np.int64)
    is_v2 = traj_kind == KINDS.index("v2")
    leaves[is_v2] = rng.choice(V2_LEAVES, int(is_v2.sum()), p=V2_LEAF_WEIGHTS)

    row_traj = np.repeat(np.arange(len(leaves)), leaves)[:samples]
    n_traj = int(row_traj[-1]) + 1
    # the cut can shorten the last trajectory; its id follows the leaves it kept
    leaves = np.bincount(row_traj, minlength=n_traj)
    traj_first = np.zeros(n_traj, dtype=np.int64)
    np.cumsum(leaves[:-1], out=traj_first[1:])
    leaf = (np.arange(samples) - traj_first[row_traj]).astype(np.int32)
    row_group = traj_group[row_traj]
    row_kind = traj_kind[row_traj]
    row_leaves = leaves[row_traj]

    index = step * INDEX_STRIDE + row_traj
    group_index = step * INDEX_STRIDE + row_group
    multi_leaf = row_leaves > 1

    # status: aborted only where a call returned a single leaf (the failed-collection copy)
    u = rng.random(samples)
    status = np.zeros(samples, dtype=np.int32)
    status[u < 0.08] = 1
    status[(u > 0.98) & ~multi_leaf] = 2

    # lengths: one prompt per group, contexts that grow with the leaf; rescaled to the mean
    prompt = lognormal(rng, prompt_share * mean_tokens, 0.5, n_groups)[row_group]
    prompt = prompt * (1.0 + 0.3 * leaf)
    response = lognormal(rng, (1 - prompt_share) * mean_tokens, 0.8, samples)
    scale = mean_tokens * samples / (prompt.sum() + response.sum())
    prompt_len = np.maximum(1, np.rint(prompt * scale)).astype(np.int64)
    response_len = np.maximum(1, np.rint(response * scale)).astype(np.int64)
    response_len[status == 2] = 0
    total_len = prompt_len + response_len

    tokens = list_array(total_len, pa.array(rng.integers(0, VOCAB_SIZE, total_len.sum(), np.int32)))

    # loss masks: null for plain GRPO rows; agentic rows mask one tool-output span
    explicit = row_kind != KINDS.index("grpo")
    mask_len = np.where(explicit, response_len, 0)
    span_start = np.floor(response_len * rng.uniform(0.2, 0.5, samples)).astype(np.int64)
    span_end = span_start + np.floor(response_len * rng.uniform(0.0, 0.3, samples)).astype(np.int64)
    mask_values = span_mask(mask_len, span_start, span_end)
    loss_mask = list_array(mask_len, pa.array(mask_values), null=~explicit)

    # rewards: one per trajectory, shared by its leaves; some groups score continuously
    difficulty = rng.beta(0.6, 0.6, n_groups)
    continuous = rng.random(n_groups) < 0.1
    traj_reward = (rng.random(n_traj) < difficulty[traj_group[:n_traj]]).astype(np.float64)
    graded = continuous[traj_group[:n_traj]]
    traj_reward[graded] = np.round(rng.random(int(graded.sum())), 2)
    reward = traj_reward[row_traj]

    columns = {
        "step": pa.array(np.full(samples, step, dtype=np.int64)),
        "group_index": pa.array(group_index),
        "index": pa.array(index),
        "leaf": pa.array(leaf),
        "rollout_id": pa.array(index, mask=~multi_leaf),
        "session_version": SESSION_VERSIONS.take(pa.array(row_kind)),
        "status": STATUSES.take(pa.array(status)),
        "tokens": tokens,
        "response_length": pa.array(response_len.astype(np.int32)),
        "loss_mask": loss_mask,
        "reward": pa.array(reward),
        "remove_sample": pa.array(rng.random(samples) < 0.01),
    }
    if log_probs:
        values = -rng.standard_exponential(int(response_len.sum()), dtype=np.float32) * 0.3
        columns["rollout_log_probs"] = list_array(response_len, pa.array(values))
    return pa.table(columns)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=32768, help="rows per step")
    parser.add_argument("--mean-tokens", type=float, default=950.0, help="mean tokens per row")
    parser.add_argument("--out", type=Path, required=True, help="folder for step=<N>.parquet")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--first-step", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--group-size", type=int, default=8, help="generate calls per prompt")
    parser.add_argument("--prompt-share", type=float, default=0.3, help="prompt share of tokens")
    parser.add_argument("--mix", default=DEFAULT_MIX, help=f"kind weights (default {DEFAULT_MIX})")
    parser.add_argument(
        "--non-compact", action="store_true", help="no v2 multi-leaf rows, so trimming applies"
    )
    parser.add_argument("--no-log-probs", action="store_true", help="omit rollout_log_probs")
    parser.add_argument("--compression", default="snappy", help="Parquet codec")
    args = parser.parse_args(argv)
    if args.samples < 1 or args.steps < 1 or args.mean_tokens < 2 or args.group_size < 1:
        parser.error("--samples, --steps and --group-size must be >= 1, --mean-tokens >= 2")

    mix = parse_mix(args.mix, args.non_compact)
    args.out.mkdir(parents=True, exist_ok=True)
    for step in range(args.first_step, args.first_step + args.steps):
        started = time.perf_counter()
        table = generate_step(
            step,
            args.samples,
            args.mean_tokens,
            mix,
            args.group_size,
            args.prompt_share,
            args.seed,
            not args.no_log_probs,
        )
        generated = time.perf_counter()
        path = args.out / f"step={step}.parquet"
        pq.write_table(table, path, compression=args.compression)
        written = time.perf_counter()
        n_tokens = pa.compute.list_value_length(table["tokens"]).to_numpy().sum()
        compact = table["rollout_id"].null_count < table.num_rows
        print(
            f"{path}: {table.num_rows} rows, {n_tokens} tokens, "
            f"{'compact' if compact else 'not compact'}, "
            f"{path.stat().st_size / 2**20:.0f} MiB; generated in {generated - started:.1f} s, "
            f"written in {written - generated:.1f} s",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

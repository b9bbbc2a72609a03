"""What balance_by_flops costs: the rollout-side schedule of a large synthetic batch by
FLOPs against the token-balanced one (balance_data), and the FLOPs themselves.

Run from the project root:
    .venv/bin/python -m bench.flops_schedule [--rows N] [--repeat R] [--miles] [--out FILE]

Prints one line per scenario (best and median wall time over the repeats) and writes them
to `--out` (default bench/results/<date>-flops-schedule.json). `--miles` also times miles'
own `build_dp_schedule` on the same batch (its source as the tests get it: MILES_SOURCE,
or a clone of its public URL), once.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from bench.bench_schedule import BenchSettings, synthetic_batch, timings
from pipeline.trainers.miles.schedule import rollout_schedule
from pipeline.trainers.miles.settings import MODEL_SHAPE, REQUIRED_SHAPE
from pipeline.transforms.flops import forward_flops, miles_model_shape

ROOT = Path(__file__).resolve().parent.parent

# Two models as a miles run gives their flags (Qwen3-4B-like dense GQA; a 30B-A3B-like MoE).
MODELS: dict[str, dict[str, Any]] = {
    "dense 4B": {
        "num_layers": 36,
        "hidden_size": 2560,
        "ffn_hidden_size": 9728,
        "num_attention_heads": 32,
        "num_query_groups": 8,
        "kv_channels": 128,
        "vocab_size": 151936,
    },
    "moe 30B-A3B": {
        "num_layers": 48,
        "hidden_size": 2048,
        "ffn_hidden_size": 6144,
        "num_attention_heads": 32,
        "num_query_groups": 4,
        "kv_channels": 128,
        "vocab_size": 151936,
        "num_experts": 128,
        "moe_router_topk": 8,
        "moe_ffn_hidden_size": 768,
    },
}
# Megatron's model flags a model above does not give (null: the parser's default applies)
SHAPE_DEFAULTS = dict.fromkeys(name for name in MODEL_SHAPE if name not in REQUIRED_SHAPE)


def _shape(model: dict[str, Any]) -> Any:
    return miles_model_shape(argparse.Namespace(**{**SHAPE_DEFAULTS, **model}))


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _commit() -> str:
    run = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return run.stdout.strip()


def _miles_schedule(keys: np.ndarray, lengths: np.ndarray, s: BenchSettings, model: dict) -> float:
    """One run of miles' own build_dp_schedule on the batch, in seconds."""
    import importlib
    import tempfile

    from tests.support import miles as ms

    cache = Path(tempfile.gettempdir()) / "rollout-shards-bench-miles"
    with ms.miles_modules(ms.head_source(cache)):
        dp_schedule = importlib.import_module("miles.utils.dp_schedule")
        shape = {**SHAPE_DEFAULTS, **model}
        shape |= {"num_query_groups": model.get("num_query_groups", 1), "kv_lora_rank": 32}
        shape |= {"qk_head_dim": 128, "qk_pos_emb_head_dim": 64, "v_head_dim": 128}
        shape |= {"moe_router_topk": model.get("moe_router_topk", 2), "moe_layer_freq": 1}
        args = ms.Args(
            **shape,
            use_dynamic_batch_size=True,
            max_tokens_per_gpu=s.max_tokens_per_gpu,
            balance_by_flops=True,
            balance_data=False,
            micro_batch_size=1,
        )
        config = {"dp_size": s.dp_size, "cp_size": 1, "vpp_size": 1}
        config["microbatch_group_size_per_vp_stage"] = None
        start = time.perf_counter()
        dp_schedule.build_dp_schedule(
            args,
            config,
            lengths.tolist(),
            global_batch_size=s.global_batch_size,
            rollout_indices=keys.tolist(),
        )
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=131_072)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=16, help="train steps per rollout step")
    parser.add_argument("--miles", action="store_true", help="also time miles' own, once")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    keys, lengths = synthetic_batch(args.rows, np.random.default_rng(args.seed))
    n_rollouts = len(np.unique(keys))
    tokens = BenchSettings(global_batch_size=n_rollouts // args.steps // 8 * 8, balance_data=True)
    flops = {name: forward_flops(lengths, _shape(model)) for name, model in MODELS.items()}
    scenarios: dict[str, Callable[[], object]] = {
        "by tokens (balance_data)": lambda: rollout_schedule(keys, lengths, tokens),
        "by tokens, strided": lambda: rollout_schedule(
            keys, lengths, replace(tokens, balance_data=False)
        ),
    }
    for name, model in MODELS.items():
        scenarios[f"FLOPs of every row, {name}"] = lambda m=model: forward_flops(lengths, _shape(m))
        scenarios[f"by FLOPs, {name}"] = lambda f=flops[name]: rollout_schedule(
            keys, lengths, tokens, f
        )
    load_before = _load()
    figures: dict[str, Any] = {}
    print(f"{args.rows} rows, {n_rollouts} rollouts, {args.steps} train steps, dp 8")
    print(f"{'scenario':<40} {'best s':>8} {'median s':>9}")
    for name, run in scenarios.items():
        seconds = timings(run, args.repeat)
        figures[name] = {
            "best_s": round(min(seconds), 4),
            "median_s": round(statistics.median(seconds), 4),
        }
        print(f"{name:<40} {min(seconds):>8.3f} {statistics.median(seconds):>9.3f}")
    if args.miles:
        for name, model in MODELS.items():
            seconds = _miles_schedule(keys, lengths, tokens, model)
            figures[f"miles' build_dp_schedule by FLOPs, {name} (once)"] = {"s": round(seconds, 3)}
            print(f"{'miles, by FLOPs, ' + name:<40} {seconds:>8.3f}")
    now = datetime.datetime.now(datetime.UTC)
    record = {
        "time": now.strftime("%Y-%m-%dT%H:%M"),
        "commit": _commit(),
        "command": " ".join(["python -m bench.flops_schedule", *sys.argv[1:]]),
        "load": [load_before, _load()],
        "rows": args.rows,
        "rollouts": n_rollouts,
        "global_batch_size": tokens.global_batch_size,
        "dp_size": tokens.dp_size,
        "max_tokens_per_gpu": tokens.max_tokens_per_gpu,
        "figures": figures,
    }
    out = args.out or ROOT / "bench" / "results" / f"{now:%Y-%m-%d}-flops-schedule.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()

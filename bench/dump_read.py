"""Reading a miles dump against `torch.load(weights_only=False)` on the same file (issue 33
item 2).

    .venv/bin/python bench/dump_read.py                       # 2048 samples, 5 rounds
    .venv/bin/python bench/dump_read.py --json bench/results/<date>-dump-read.json

Writes a dump as miles' `save_debug_rollout_data` does (`torch.save` of `rollout_id`,
`metadata` and `samples`, each sample a `Sample.to_dict()` with Python lists for `tokens`,
`loss_mask` and `rollout_log_probs`), then times, interleaved round by round so that load
from other work hits each alike:

- `torch.load(path, weights_only=False)`: the unrestricted unpickler, the yardstick;
- `load_payload(path)`: the restricted, bounded unpickler of `pipeline.io.formats.unpickle`;
- `read_miles_dump(path)`: that plus mapping the samples to contract columns.

Prints the minimum and median of each and their ratios to torch.load; `--json` also
stores them with the machine's load average.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def miles_sample(index: int, rng: random.Random, mean_response: int) -> dict[str, Any]:
    """A `Sample.to_dict()` of miles (the tests' `sample_dict`) with plausible sizes."""
    from tests.support.miles_dump import sample_dict

    prompt = rng.randint(200, 800)
    response = max(1, int(rng.expovariate(1 / mean_response)))
    return sample_dict(
        group_index=index // 8,
        index=index,
        prompt="Solve: " + "x" * rng.randint(100, 600),
        tokens=[rng.randrange(150_000) for _ in range(prompt + response)],
        response="y" * (3 * response),
        response_length=response,
        label="42",
        reward=float(rng.random() < 0.5),
        loss_mask=[1] * response,
        weight_versions=[[{"version": "12", "abs_start": prompt, "abs_end": prompt + response}]],
        rollout_log_probs=[-rng.random() for _ in range(response)],
        metadata={"raw_reward": 1.0, "source": "gsm8k"},
        spec_info={
            "spec_num_correct_drafts": 0,
            "spec_num_proposed_drafts": 0,
            "spec_verify_ct": 0,
            "completion_tokens": response,
        },
        prefix_cache_info={"cached_tokens": 0, "total_prompt_tokens": prompt},
    )


def write_dump(path: Path, samples: int, mean_response: int, seed: int = 0) -> dict[str, int]:
    import torch

    rng = random.Random(seed)
    batch = [miles_sample(i, rng, mean_response) for i in range(samples)]
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {"rollout_id": 3, "metadata": {"dynamic_global_batch_size": samples}, "samples": batch},
        path,
    )
    return {
        "samples": samples,
        "tokens": sum(len(s["tokens"]) for s in batch),
        "file_bytes": path.stat().st_size,
    }


def timed(function: Callable[[], Any]) -> float:
    gc.collect()
    start = time.perf_counter()
    value = function()
    elapsed = time.perf_counter() - start
    del value
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--mean-response", type=int, default=1200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="store the figures here")
    args = parser.parse_args()

    import torch

    from pipeline.io.formats.miles import read_miles_dump
    from pipeline.io.formats.unpickle import read_torch_save as load_payload

    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / "rollout_data" / "3.pt"
        size = write_dump(path, args.samples, args.mean_response)
        readers: dict[str, Callable[[], Any]] = {
            "torch_load": lambda: torch.load(path, weights_only=False),
            "load_payload": lambda: load_payload(path),
            "read_miles_dump": lambda: read_miles_dump(path),
        }
        for reader in readers.values():  # warm the page cache and the imports
            timed(reader)
        times: dict[str, list[float]] = {name: [] for name in readers}
        for _ in range(args.rounds):
            for name, reader in readers.items():
                times[name].append(timed(reader))

    base_min = min(times["torch_load"])
    base_median = statistics.median(times["torch_load"])
    figures = {
        name: {
            "seconds": [round(t, 4) for t in values],
            "min": round(min(values), 4),
            "median": round(statistics.median(values), 4),
            "ratio_min": round(min(values) / base_min, 3),
            "ratio_median": round(statistics.median(values) / base_median, 3),
        }
        for name, values in times.items()
    }
    print(
        f"dump of {size['samples']} samples, {size['tokens']:,} tokens, "
        f"{size['file_bytes'] / 2**20:.1f} MiB; {args.rounds} interleaved rounds"
    )
    for name, row in figures.items():
        print(
            f"  {name:16s} min {row['min']:.3f} s  median {row['median']:.3f} s  "
            f"x torch.load: {row['ratio_min']:.2f} (min) {row['ratio_median']:.2f} (median)"
        )
    if args.json is not None:
        record = {
            "bench": "dump_read",
            "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "torch": torch.__version__,
                "load_average_after": [round(x, 2) for x in os.getloadavg()],
            },
            "dump": size,
            "rounds": args.rounds,
            "figures": figures,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

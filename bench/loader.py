"""The loader's time to read a step's rank set next to plain pyarrow reads of the files.

Generates one step (bench/generate.py), builds it (`rollout-shards build`), then times,
interleaved and repeated (medians reported, the machine is shared):

- `loader`: `read_rank(folder, r)` for every rank, the trainer's Python dicts;
- `loader as_numpy`: `read_rank(folder, r, as_numpy=True)`, numpy arrays (flat values and
  offsets for ragged columns), every file it reads checked against the manifest, as by
  default: its own file by sha256 (once per process and file), the two columns it reads
  of each other rank's file by the manifest's `raw_reward_sha256`, row counts;
- `loader as_numpy, a process per rank`: the same, forgetting the verified files before
  each rank, as a trainer whose ranks are processes of their own pays;
- `loader as_numpy, manifest without raw_reward_sha256` (and `... and a process per
  rank`): the same two on a copy of the step (the rank files hard-linked) whose manifest
  lacks the column digests, as one written before them: a rank hashes every rank file it
  reads whole (its own, and the others for the batch-wide `raw_reward`), as every
  manifest had it before `raw_reward_sha256`;
- `loader as_numpy unverified`: the same with `verify=False` (no digests or row counts);
- `read_table`: `pyarrow.parquet.read_table` of every rank file (Arrow, no Python objects);
- `read_table+to_pylist`: the same tables turned into Python lists column by column, the
  plain-pyarrow way to the values the trainer holds.

Each round runs every reader once, each round in another order. Printed per reader: the
median time, its ratio to `read_table`'s, the median over rounds of the round's time over
that round's `read_table` (paired: a load change hits both), and the ratio of median CPU
seconds (every thread of the process), which depends least on the other work on the
machine. The JSON keeps every round and the load average after each.

    python bench/loader.py --samples 32768 --mean-tokens 950 --work /tmp/loader-bench \
        --json bench/results/<date>-loader-read.json --what "what the run measures"

`--no-python` leaves out the two Python-object readers (several times slower: they build
tens of millions of Python ints and floats).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "loader"))

import rollout_shards_loader._verify as verifier  # noqa: E402
from rollout_shards_loader import read_rank  # noqa: E402


def prepare(work: Path, samples: int, mean_tokens: float, dp: int) -> Path:
    folder = work / "out" / "step=0"
    if (folder / "manifest.json").is_file():
        return folder
    python = sys.executable
    subprocess.run(
        [
            python,
            str(REPO / "bench" / "generate.py"),
            "--samples",
            str(samples),
            "--mean-tokens",
            str(mean_tokens),
            "--out",
            str(work / "in"),
            "--steps",
            "1",
            "--non-compact",
        ],
        check=True,
    )
    subprocess.run(
        [
            python,
            "-m",
            "pipeline.cli",
            "build",
            str(work / "in"),
            "--out",
            str(work / "out"),
            "--global-batch-size",
            str(samples // 8 // dp * dp),
            "--dp-size",
            str(dp),
        ],
        check=True,
        cwd=REPO,
    )
    return folder


def without_column_digests(folder: Path, work: Path) -> Path:
    """A copy of the step folder (rank files hard-linked, so the same page cache) whose
    manifest has no `raw_reward_sha256`, as a manifest written before it existed."""
    copy = work / "old-manifest" / folder.name
    if copy.exists():
        shutil.rmtree(copy)
    copy.mkdir(parents=True)
    for path in folder.glob("rank=*.parquet"):
        os.link(path, copy / path.name)
    manifest = json.loads((folder / "manifest.json").read_text())
    for output in manifest["outputs"]:
        output.pop("raw_reward_sha256", None)
    (copy / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return copy


def time_once(fn) -> tuple[float, float]:
    """Wall seconds and this process's CPU seconds (every thread) of one call."""
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - start, time.process_time() - cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=32768)
    parser.add_argument("--mean-tokens", type=float, default=950.0)
    parser.add_argument("--dp", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--no-python", action="store_true")
    parser.add_argument("--json", type=Path, help="write the run here")
    parser.add_argument("--what", default="", help="what the run measures, for the JSON")
    args = parser.parse_args(argv)
    folder = prepare(args.work, args.samples, args.mean_tokens, args.dp)
    old = without_column_digests(folder, args.work)
    paths = sorted(folder.glob("rank=*.parquet"))

    def loader() -> None:
        verifier._VERIFIED.clear()
        for rank in range(len(paths)):
            read_rank(folder, rank)

    def loader_numpy() -> None:
        verifier._VERIFIED.clear()
        for rank in range(len(paths)):
            read_rank(folder, rank, as_numpy=True)

    def loader_numpy_per_process() -> None:
        for rank in range(len(paths)):
            verifier._VERIFIED.clear()
            read_rank(folder, rank, as_numpy=True)

    def loader_numpy_old_manifest() -> None:
        verifier._VERIFIED.clear()
        for rank in range(len(paths)):
            read_rank(old, rank, as_numpy=True)

    def loader_numpy_old_manifest_per_process() -> None:
        for rank in range(len(paths)):
            verifier._VERIFIED.clear()
            read_rank(old, rank, as_numpy=True)

    def loader_numpy_unverified() -> None:
        for rank in range(len(paths)):
            read_rank(folder, rank, as_numpy=True, verify=False)

    def read_table() -> None:
        for path in paths:
            pq.read_table(path)

    def read_table_to_pylist() -> None:
        for path in paths:
            table = pq.read_table(path)
            for column in table.columns:
                column.to_pylist()

    runs = {
        "loader as_numpy": loader_numpy,
        "loader as_numpy, a process per rank": loader_numpy_per_process,
        "loader as_numpy, manifest without raw_reward_sha256": loader_numpy_old_manifest,
        "... and a process per rank": loader_numpy_old_manifest_per_process,
        "loader as_numpy unverified": loader_numpy_unverified,
        "read_table": read_table,
    }
    if not args.no_python:
        runs |= {"loader": loader, "read_table+to_pylist": read_table_to_pylist}
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    loads = []
    for round_ in range(args.repeats):
        # interleaved, each round in another order: load changes hit every method alike
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            wall, used = time_once(runs[name])
            times[name].append(wall)
            cpu[name].append(used)
        loads.append(os.getloadavg()[0])
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    paired = {
        name: statistics.median(t / b for t, b in zip(ts, times["read_table"], strict=True))
        for name, ts in times.items()
    }
    cpu_ratio = {
        name: statistics.median(cs) / statistics.median(cpu["read_table"])
        for name, cs in cpu.items()
    }
    rows = sum(pq.ParquetFile(p).metadata.num_rows for p in paths)
    size = sum(p.stat().st_size for p in paths)
    base = medians["read_table"]
    print(
        f"{rows} rows in {len(paths)} rank files ({size / 2**20:.0f} MiB), median of "
        f"{args.repeats} interleaved runs:"
    )
    for name, median in medians.items():
        print(
            f"  {name:52s} {median:7.3f} s  ({median / base:.2f}x read_table, "
            f"{paired[name]:.2f}x in its rounds, CPU {cpu_ratio[name]:.2f}x)"
        )
    print(
        f"load average before {load_before[0]:.2f}, during (median of rounds) "
        f"{statistics.median(loads):.2f}, after {loads[-1]:.2f}"
    )
    if args.json:
        record = {
            "what": args.what,
            "command": shlex.join(["python", "bench/loader.py", *(argv or sys.argv[1:])]),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()} {os.cpu_count()} cpus, shared",
            "load_average_before_after": [load_before[0], loads[-1]],
            "load_average_after_each_round": loads,
            "samples": args.samples,
            "mean_tokens": args.mean_tokens,
            "dp": args.dp,
            "rows": rows,
            "rank_file_bytes": size,
            "repeats": args.repeats,
            "seconds": times,
            "median_seconds": medians,
            "ratio_to_read_table": {name: m / base for name, m in medians.items()},
            "median_ratio_in_round": paired,
            "cpu_seconds": cpu,
            "cpu_ratio_to_read_table": cpu_ratio,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The loader's time to read a step's rank set next to plain pyarrow reads of the files.

Generates one step (bench/generate.py), builds it (`rollout-shards build`), then times,
interleaved and repeated (medians reported, the machine is shared):

- `loader`: `read_rank(folder, r)` for every rank, the trainer's Python dicts;
- `loader as_numpy`: `read_rank(folder, r, as_numpy=True)`, numpy arrays (flat values and
  offsets for ragged columns);
- `read_table`: `pyarrow.parquet.read_table` of every rank file (Arrow, no Python objects);
- `read_table+to_pylist`: the same tables turned into Python lists column by column, the
  plain-pyarrow way to the values the trainer holds.

    python bench/loader.py --samples 32768 --mean-tokens 950 --work /tmp/loader-bench
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "loader"))

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


def time_once(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=32768)
    parser.add_argument("--mean-tokens", type=float, default=950.0)
    parser.add_argument("--dp", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--work", type=Path, required=True)
    args = parser.parse_args(argv)
    folder = prepare(args.work, args.samples, args.mean_tokens, args.dp)
    paths = sorted(folder.glob("rank=*.parquet"))

    def loader() -> None:
        for rank in range(len(paths)):
            read_rank(folder, rank)

    def loader_numpy() -> None:
        for rank in range(len(paths)):
            read_rank(folder, rank, as_numpy=True)

    def read_table() -> None:
        for path in paths:
            pq.read_table(path)

    def read_table_to_pylist() -> None:
        for path in paths:
            table = pq.read_table(path)
            for column in table.columns:
                column.to_pylist()

    runs = {
        "loader": loader,
        "loader as_numpy": loader_numpy,
        "read_table": read_table,
        "read_table+to_pylist": read_table_to_pylist,
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, fn in runs.items():  # interleaved: load changes hit every method alike
            times[name].append(time_once(fn))
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    rows = sum(pq.ParquetFile(p).metadata.num_rows for p in paths)
    print(f"{rows} rows in {len(paths)} rank files, median of {args.repeats} interleaved runs:")
    for name, median in medians.items():
        print(f"  {name:22s} {median:7.3f} s  ({median / medians['loader']:.2f}x the loader)")
    print(
        f"loader / read_table = {medians['loader'] / medians['read_table']:.2f}x; "
        f"loader as_numpy / read_table = "
        f"{medians['loader as_numpy'] / medians['read_table']:.2f}x; "
        f"loader / read_table+to_pylist = "
        f"{medians['loader'] / medians['read_table+to_pylist']:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where the rank-bounded build's time goes as a step grows, against the I/O floor.

For each step folder given (one `step=0.parquet`, as `bench/generate.py` writes it), in
alternated rounds: the floor (`bench/run.py _floor`: Polars reads the step and writes it
back with the shards' Parquet options), the least build (`bench/least_build.py`: the floor
plus what the contract adds, the input's and every rank file's sha256 and fsync, the step
held whole) and the rank-bounded build (`--stream-above 0`), each a process of its own
(wall, CPU and peak RSS from `os.wait4`), all with the allocator settings a build gives
Polars; then one profiled build
in a child of its own that records each stage's wall and CPU seconds (`run_step`'s
reporter) and per rank the gather of its lists (`SpilledRows.rows`), the Parquet write
(`writer.write_parquet`) and the seal (hash, fsync, footer), each call's wall and thread CPU
seconds. The ratios to watch: build/floor as the step grows, least/floor (no build is
faster than the least one), and which stage grows faster than the step.

    python bench/stage_profile.py bench/out/inputs/non-compact-32768-950 \\
        bench/out/inputs/non-compact-131072-950 bench/out/inputs/non-compact-409600-950

The load average (before, after) and cores are in the record; on a loaded machine the
stage CPU seconds mean more than the wall times.

`--in-memory` alternates a third run, the build holding its lists in memory. A VM whose
kernel reports freed memory to its host (free page reporting) charges a host fault for each
page touched again after it was reported, which the spill of a bounded build pays most: the
record keeps the kernel's reporting settings, and `--page-reporting-order N` (root) sets
the smallest block it reports for the run and puts the old value back after (11, past the
largest block, reports nothing).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import bench_record  # noqa: E402
from run import PYTHON, timed  # noqa: E402  (bench/run.py, beside this script)

# The guest kernel's free page reporting (mm/page_reporting.c): freed blocks of at least
# 2**order pages go back to the host, once min_free_ms has passed.
REPORTING = Path("/sys/module/page_reporting/parameters")
# `--stream-above` (MiB) of the in-memory run: past any step's input.
HELD_MIB = 1 << 30

PROFILED = """
import json, sys, time, threading
from pathlib import Path
from pipeline.speed import tune_process
tune_process()
from pipeline.io import writer
from pipeline.io.discovery import find_sources
from pipeline.io.load import group_steps
from pipeline.settings import Settings
from pipeline.step import build, write
from pipeline.step.readers import spill

calls = []
def timed(name, function):
    def wrapper(*args, **kwargs):
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            calls.append((name, time.perf_counter() - wall, time.thread_time() - cpu))
    return wrapper

spill.SpilledRows.rows = timed("gather", spill.SpilledRows.rows)
writer.write_parquet = timed("parquet_write", writer.write_parquet)
write._seal_rank = timed("seal", write._seal_rank)
stages = {}
class Reporter:
    def begin(self, step, stage):
        stages[stage] = (time.perf_counter(), time.process_time())
    def end(self, step, stage, detail):
        wall, cpu = stages[stage]
        stages[stage] = (time.perf_counter() - wall, time.process_time() - cpu)
    def up_to_date(self, step, folder):
        pass

spec = json.loads(sys.argv[1])
settings = Settings(**spec["settings"])
for step, files in group_steps(find_sources([Path(spec["inputs"])])).items():
    build.build_step(step, files, settings, Path(spec["out"]), reporter=Reporter())
totals = {}
for name, wall, cpu in calls:
    mine = totals.setdefault(name, [0, 0.0, 0.0])
    mine[0] += 1; mine[1] += wall; mine[2] += cpu
print(json.dumps({"stages": stages, "calls": totals}))
"""


def profiled(step: Path, out: Path, settings: dict[str, Any]) -> dict[str, Any]:
    spec = {"inputs": str(step), "out": str(out), "settings": settings}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [PYTHON, "-c", PROFILED, json.dumps(spec)], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"profiled build failed:\n{done.stderr[-3000:]}")
    shutil.rmtree(out, ignore_errors=True)
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "stages": {
            k: {"wall_s": round(w, 2), "cpu_s": round(c, 2)}
            for k, (w, c) in report["stages"].items()
        },
        "calls": {
            k: {"calls": n, "wall_s": round(w, 2), "thread_cpu_s": round(c, 2)}
            for k, (n, w, c) in report["calls"].items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps", type=Path, nargs="+")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dp-size", type=int, default=8)
    parser.add_argument("--global-batch-size", type=int, default=256)
    parser.add_argument("--work", type=Path, default=Path("/tmp/rollout-shards-stage-profile"))
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--in-memory", action="store_true")
    parser.add_argument("--page-reporting-order", type=int)
    args = parser.parse_args(argv)
    with reporting_order(args.page_reporting_order):
        return measure(args, argv)


def reporting_settings() -> dict[str, str]:
    """The kernel's page reporting parameters (none where it has none)."""
    names = ("page_reporting_order", "min_free_ms", "max_waiting_mib")
    return {n: (REPORTING / n).read_text().strip() for n in names if (REPORTING / n).exists()}


@contextlib.contextmanager
def reporting_order(order: int | None) -> Iterator[None]:
    """The kernel reporting freed blocks from 2**`order` pages while the block runs."""
    if order is None:
        yield
        return
    path = REPORTING / "page_reporting_order"
    before = path.read_text().strip()
    path.write_text(str(order))
    try:
        # The pages reported before are the host's until touched: touch as much as the
        # runs will, then free it, so that each run starts from the same pages.
        subprocess.run([PYTHON, "-c", "bytearray(12 << 30)"], check=True, env={"PYTHONPATH": ""})
        time.sleep(5)
        yield
    finally:
        path.write_text(before)


def measure(args: argparse.Namespace, argv: list[str] | None) -> int:
    from pipeline.io.writer import PARQUET_OPTIONS
    from pipeline.speed import ALLOCATOR_CONF, ALLOCATOR_ENV

    load_before = os.getloadavg()
    args.work.mkdir(parents=True, exist_ok=True)
    env = {
        # the floor and the least build read and write with a build's allocator settings
        # (unless the user set their own), as `bench/run.py` runs the floor
        ALLOCATOR_ENV: ALLOCATOR_CONF,
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "BENCH_PARQUET_OPTIONS": json.dumps(PARQUET_OPTIONS),
    }
    flags = ["--global-batch-size", str(args.global_batch_size), "--dp-size", str(args.dp_size)]
    settings = {
        "global_batch_size": args.global_batch_size,
        "dp_size": args.dp_size,
        "stream_above": 0,
    }

    def build_command(step: Path, out: Path, stream_above_mib: int) -> list[str | Path]:
        return [PYTHON, "-m", "pipeline.cli", "build", step, "--out", out, *flags,
                "--stream-above", str(stream_above_mib)]  # fmt: skip

    cases = []
    for step in args.steps:
        # the builds after each floor run: their --stream-above (MiB)
        builds = {"build": 0, **({"in_memory": HELD_MIB} if args.in_memory else {})}
        runs: dict[str, list[dict[str, float]]] = {
            "floor": [],
            "least": [],
            **{name: [] for name in builds},
        }
        out = args.work / "out"
        for _ in range(args.rounds):  # alternated, floor first
            floor = timed(
                [
                    PYTHON,
                    HERE / "run.py",
                    "_floor",
                    step / "step=0.parquet",
                    args.work / "floor.parquet",
                ],
                args.work / "floor.log",
                env=env,
                inputs=step,
            )
            (args.work / "floor.parquet").unlink(missing_ok=True)
            least = timed(
                [PYTHON, HERE / "least_build.py", step / "step=0.parquet", out, args.dp_size],
                args.work / "least.log",
                env=env,
                inputs=step,
            )
            shutil.rmtree(out, ignore_errors=True)
            done = [("floor", floor), ("least", least)]
            for name, stream_above_mib in builds.items():
                command = build_command(step, out, stream_above_mib)
                done.append((name, timed(command, args.work / f"{name}.log", env=env, inputs=step)))
                shutil.rmtree(out, ignore_errors=True)
            for name, run in done:
                runs[name].append(
                    {
                        "wall_s": round(run.wall, 2),
                        "cpu_s": round(run.cpu, 2),
                        "rss_mib": round(run.rss, 1),
                    }
                )
        best = {name: min(r["wall_s"] for r in found) for name, found in runs.items()}
        rss = {name: max(r["rss_mib"] for r in found) for name, found in runs.items()}
        cases.append(
            {
                "step": step.name,
                "input_mib": round((step / "step=0.parquet").stat().st_size / 2**20, 1),
                "runs": runs,
                "build_over_floor_best_wall": round(best["build"] / best["floor"], 3),
                "least_over_floor_best_wall": round(best["least"] / best["floor"], 3),
                "build_over_least_best_wall": round(best["build"] / best["least"], 3),
                "build_over_floor_peak_rss": round(rss["build"] / rss["floor"], 3),
                **(
                    {"in_memory_over_floor_best_wall": round(best["in_memory"] / best["floor"], 3)}
                    if args.in_memory
                    else {}
                ),
                "profile": profiled(step, out, settings),
            }
        )
        print(json.dumps(cases[-1]), flush=True)
    result = bench_record.record(
        "stage_profile.py",
        argv,
        {
            "machine": f"{os.cpu_count()} cores, shared",
            "page_reporting": reporting_settings(),
        },
        load_before,
        dp_size=args.dp_size,
        global_batch_size=args.global_batch_size,
        cases=cases,
    )
    bench_record.save(result, args.results, "stage-profile", show=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

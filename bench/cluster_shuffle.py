"""Whether a step's cost on a Ray cluster is flat in `dp_size`: the same step built on a
three-node local cluster (`tests/orchestration/ray_cluster.py`: 127.0.0.1, token auth, a
head that runs no task and two worker nodes) at two data-parallel sizes, and in process.

Each cluster build runs in a driver process of its own (`DRIVER` below) that builds the
step through `ray_ranks` and reports every task: its function, its CPU seconds in the
worker (`time.process_time` across the call) and the bytes of typed rows it decoded from
the input files (`shares.DECODED`). Recorded per way: wall time, the sum of the tasks' CPU
seconds per function, the driver's CPU seconds, the bytes decoded per function and the
largest one task decoded; for the in-process build its process's CPU seconds (children
included) and wall time. The shards of every way must be byte-identical.

    python bench/cluster_shuffle.py --samples 524288           # the issue's step
    python bench/cluster_shuffle.py --samples 131072           # a loaded machine

The machine's load average (before and after) and CPU count are in the record: on a
loaded machine the times mean little, the CPU sums somewhat more.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# the repository too: the cluster module imports tests.support
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests" / "orchestration"), str(ROOT)]

import bench_record  # noqa: E402
import ray_cluster  # noqa: E402
import ray_tasks  # noqa: E402

DRIVER = """
import json, os, sys, time
from pathlib import Path
from pipeline.io.discovery import find_sources
from pipeline.io.load import group_steps
from pipeline.settings import Settings
from pipeline.step import ray_ranks
from pipeline.step.build import build_step

spec = json.loads(sys.argv[1])
tasks = ray_ranks.RayTasks(resources={"rollout_worker": 1})
with ray_ranks.connected(spec["address"], tasks, node_ip_address="127.0.0.1") as route:
    cpu, wall = time.process_time(), time.perf_counter()
    for step, files in group_steps(find_sources([Path(spec["inputs"])])).items():
        build_step(step, files, Settings(**spec["settings"]), Path(spec["out"]), route=route)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
hwm = [l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
ran = [[r.task, r.node, r.cpu_s, r.decoded] for r in tasks.ran]
print(json.dumps({"wall_s": wall, "driver_cpu_s": cpu, "driver_hwm_kib": int(hwm), "ran": ran}))
"""


def on_cluster(
    cluster: ray_cluster.RayCluster, inputs: Path, out: Path, settings: dict[str, Any]
) -> dict[str, Any]:
    """One build through `DRIVER`: its wall time, the tasks' CPU and decoded bytes."""
    spec = {"address": cluster.address, "inputs": str(inputs), "out": str(out)}
    spec["settings"] = settings | {"ray_above": 0}
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(spec)],
        env=cluster.environment(),
        capture_output=True,
        text=True,
    )
    process_wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"cluster build failed:\n{result.stderr[-3000:]}")
    report = json.loads(result.stdout.strip().splitlines()[-1])
    by_task: dict[str, dict[str, float]] = {}
    for task, _, cpu_s, decoded in report["ran"]:
        mine = by_task.setdefault(task, {"tasks": 0, "cpu_s": 0.0, "decoded_mib": 0.0})
        mine["tasks"] += 1
        mine["cpu_s"] += cpu_s
        mine["decoded_mib"] += decoded / 2**20
    tasks_cpu = sum(cpu for _, _, cpu, _ in report["ran"])
    return {
        "wall_s": round(report["wall_s"], 2),
        "process_wall_s": round(process_wall, 2),
        "tasks_cpu_s": round(tasks_cpu, 2),
        "driver_cpu_s": round(report["driver_cpu_s"], 2),
        "cpu_s": round(tasks_cpu + report["driver_cpu_s"], 2),
        "driver_peak_rss_mib": round(report["driver_hwm_kib"] / 1024, 1),
        "decoded_mib": round(sum(d for _, _, _, d in report["ran"]) / 2**20, 1),
        "largest_task_decoded_mib": round(max(d for _, _, _, d in report["ran"]) / 2**20, 1),
        "by_task": {
            task: {k: round(v, 2) if isinstance(v, float) else v for k, v in mine.items()}
            for task, mine in sorted(by_task.items())
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=524_288)
    parser.add_argument("--mean-tokens", type=float, default=950.0)
    parser.add_argument("--dp-sizes", type=int, nargs=2, default=[8, 32])
    parser.add_argument("--global-batch-size", type=int, default=1024)
    parser.add_argument("--row-group-rows", type=int, default=16_384)
    # Each worker node's object store, where the shuffle's pieces wait for their rank's
    # task: a cluster_utils node's default store is small and spills the pieces to disk,
    # which a real cluster (30% of a node's memory by default) would not (0: that default).
    parser.add_argument("--object-store-mib", type=int, default=4096)
    parser.add_argument("--work", type=Path, default=Path("/tmp/rollout-shards-bench-shuffle"))
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)

    load_before = os.getloadavg()
    size = ray_tasks.generate(args.work / "step", 1, args.samples, args)
    inputs = args.work / "step"
    state = args.work / "cluster.json"
    state.unlink(missing_ok=True)
    cluster = ray_cluster.start(state, 600, args.object_store_mib << 20 or None)
    figures: dict[str, Any] = {}
    outs: dict[str, dict[str, str]] = {}
    try:
        for dp in args.dp_sizes:
            settings = {"global_batch_size": args.global_batch_size, "dp_size": dp}
            flags = ["--global-batch-size", str(args.global_batch_size), "--dp-size", str(dp)]
            # in process first (the same step, the same settings), then on the cluster
            out = args.work / f"out-in-process-{dp}"
            subprocess.run(["rm", "-rf", str(out)], check=True)
            figures[f"dp{dp}_in_process"] = ray_tasks.build(
                inputs, out, flags, cluster.environment()
            )
            outs[f"in_process_{dp}"] = ray_tasks.shards(out)
            out = args.work / f"out-ray-{dp}"
            subprocess.run(["rm", "-rf", str(out)], check=True)
            figures[f"dp{dp}_ray"] = on_cluster(cluster, inputs, out, settings)
            outs[f"ray_{dp}"] = ray_tasks.shards(out)
            figures[f"dp{dp}_identical"] = outs[f"ray_{dp}"] == outs[f"in_process_{dp}"]
    finally:
        ray_cluster.stop(cluster.pid)
    small, large = (f"dp{dp}" for dp in args.dp_sizes)
    ratios = {
        f"{large}_over_{small}_tasks_cpu": figures[f"{large}_ray"]["tasks_cpu_s"]
        / figures[f"{small}_ray"]["tasks_cpu_s"],
        f"{large}_over_{small}_cpu": figures[f"{large}_ray"]["cpu_s"]
        / figures[f"{small}_ray"]["cpu_s"],
        f"{large}_ray_cpu_over_in_process_cpu": figures[f"{large}_ray"]["cpu_s"]
        / figures[f"{large}_in_process"]["cpu_s"],
        f"{small}_ray_cpu_over_in_process_cpu": figures[f"{small}_ray"]["cpu_s"]
        / figures[f"{small}_in_process"]["cpu_s"],
        f"{small}_ray_wall_over_in_process": figures[f"{small}_ray"]["process_wall_s"]
        / figures[f"{small}_in_process"]["wall_s"],
    }
    machine = f"{os.cpu_count()} cores, shared; the cluster's three nodes on 127.0.0.1"
    result = bench_record.record(
        "cluster_shuffle.py",
        argv,
        {"machine": machine},
        load_before,
        samples=args.samples,
        input_mib=round(size / 2**20, 1),
        global_batch_size=args.global_batch_size,
        row_group_rows=args.row_group_rows,
        object_store_mib_per_worker=args.object_store_mib or None,
        **{name: round(value, 3) for name, value in ratios.items()},
        **figures,
    )
    bench_record.save(result, args.results, f"cluster-shuffle-{args.samples}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

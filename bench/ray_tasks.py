"""A step built across a three-node local Ray cluster (`rollout-shards build --ray`) against
the in-process build: time, peak RSS of every process, the driver's read bytes, and the
bytes of the shards; then a four-step backfill both ways.

The cluster is `tests/orchestration/ray_cluster.py`'s: a head that runs no task (the
driver attaches there) and two worker nodes, on 127.0.0.1 with Ray's token authentication.
Every process of the cluster (GCS, raylets, workers) is in its own session; each one's
peak RSS is its `VmHWM`, read every tenth of a second. The driver's read bytes are its
`rchar` (every byte it read through read(2): Python's own files included).

    python bench/ray_tasks.py --samples 524288 --dp-size 16 --global-batch-size 1024
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# the repository too: the cluster module imports tests.support
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests" / "orchestration"), str(ROOT)]

import bench_record  # noqa: E402
import ray_cluster  # noqa: E402

DRIVER = (
    "import sys\n"
    "from pipeline.cli import main\n"
    "status = main(sys.argv[1:])\n"
    "io = dict(l.split(': ') for l in open('/proc/self/io').read().splitlines())\n"
    "print('RCHAR', io['rchar'], file=sys.stderr)\n"
    "hwm = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')]\n"
    "print('VMHWM', hwm[0], file=sys.stderr)\n"
    "sys.exit(status)\n"
)


def _status(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


class Watch:
    """Peak RSS (VmHWM) of every process in a session, sampled until stopped."""

    def __init__(self, session: int) -> None:
        self.session = session
        self.peaks: dict[int, tuple[str, int]] = {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.wait(0.1):
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                pid = int(entry)
                try:
                    if os.getsid(pid) != self.session:
                        continue
                    # the program's name alone (`ray::_run_call`, `raylet`), not its path
                    name = os.path.basename(
                        Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
                    )
                except (ProcessLookupError, FileNotFoundError, PermissionError):
                    continue
                peak = _status(pid, "VmHWM")
                if peak > self.peaks.get(pid, ("", 0))[1]:
                    self.peaks[pid] = (name.decode(errors="replace"), peak)

    def stop(self) -> dict[str, Any]:
        self.stopping.set()
        self.thread.join()
        ranked = sorted(self.peaks.items(), key=lambda item: -item[1][1])
        return {
            "max_mib": round(ranked[0][1][1] / 2**20, 1) if ranked else None,
            "top": [[pid, name, round(peak / 2**20, 1)] for pid, (name, peak) in ranked[:6]],
        }


def build(inputs: Path, out: Path, flags: list[str], env: dict[str, str]) -> dict[str, Any]:
    """One `rollout-shards build`: its wall time, peak RSS and read bytes."""
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-c", DRIVER, "build", str(inputs), "--out", str(out), *flags],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    stdout = process.stdout.read() if process.stdout else ""
    stderr = process.stderr.read() if process.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"build failed:\n{stdout}\n{stderr[-3000:]}")
    found = {line.split()[0]: int(line.split()[1]) for line in stderr.splitlines()[-2:]}
    # the driver's own VmHWM (KiB): wait4's ru_maxrss would count the pages of this process
    # that its child held between fork and exec
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_mib": round(found["VMHWM"] / 1024, 1),
        "rchar": found["RCHAR"],
    }


def shards(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.glob("step=*/*"))
    }


def generate(folder: Path, steps: int, samples: int, args: argparse.Namespace) -> int:
    """`steps` steps of `samples` rows, each Parquet file in row groups of
    `--row-group-rows` (a file written as one row group is one task's share)."""
    import generate as gen
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    mix = gen.parse_mix(gen.DEFAULT_MIX, False)
    for step in range(steps):
        path = folder / f"step={step}.parquet"
        if not path.exists():
            table = gen.generate_step(step, samples, args.mean_tokens, mix, 8, 0.3, 0, True)
            pq.write_table(table, path, row_group_size=args.row_group_rows)
    return sum(path.stat().st_size for path in folder.glob("step=*.parquet"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=524_288)
    parser.add_argument("--mean-tokens", type=float, default=950.0)
    parser.add_argument("--dp-size", type=int, default=16)
    parser.add_argument("--global-batch-size", type=int, default=1024)
    parser.add_argument("--row-group-rows", type=int, default=16_384)
    parser.add_argument("--backfill-samples", type=int, default=32_768)
    parser.add_argument("--work", type=Path, default=Path("/tmp/rollout-shards-bench-ray"))
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)

    load_before = os.getloadavg()
    big = generate(args.work / "big", 1, args.samples, args)
    backfill = generate(args.work / "backfill", 4, args.backfill_samples, args)
    state = args.work / "cluster.json"
    state.unlink(missing_ok=True)
    started = time.perf_counter()
    cluster = ray_cluster.start(state, 600)
    cluster_start = time.perf_counter() - started
    env = cluster.environment()
    flags = ["--global-batch-size", str(args.global_batch_size), "--dp-size", str(args.dp_size)]
    figures: dict[str, Any] = {"cluster_start_s": round(cluster_start, 1)}
    # each way's flags: in process; every step on the cluster (ray_above 0); the defaults,
    # where a step of ray_above MiB or less stays in the driver's process
    ways = {
        "in_process": [],
        "ray": ["--ray", cluster.address, "--ray-above", "0"],
        "ray_default": ["--ray", cluster.address],
    }
    cases = (("step", "big", big, ways), ("backfill", "backfill", backfill, ways))
    try:
        for name, folder, size, chosen in cases:
            inputs, outs = args.work / folder, {}
            for way, ray_flags in chosen.items():
                if name == "step" and way == "ray_default":
                    continue
                out = args.work / f"out-{folder}-{way}"
                subprocess.run(["rm", "-rf", str(out)], check=True)
                watch = Watch(os.getsid(cluster.pid))
                measured = build(inputs, out, flags + ray_flags, env)
                measured["cluster_processes"] = watch.stop()
                measured["driver_rchar_share_of_input"] = round(measured["rchar"] / size, 4)
                figures[f"{name}_{way}"] = measured
                outs[way] = shards(out)
                base = figures[f"{name}_in_process"]["wall_s"]
                figures[f"{name}_{way}_over_in_process"] = round(measured["wall_s"] / base, 2)
                figures[f"{name}_{way}_identical"] = outs[way] == outs["in_process"]
            figures[f"{name}_input_mib"] = round(size / 2**20, 1)
    finally:
        ray_cluster.stop(cluster.pid)
    result = bench_record.record(
        "ray_tasks.py",
        argv,
        {"cpus": os.cpu_count()},
        load_before,
        samples=args.samples,
        backfill_samples=args.backfill_samples,
        dp_size=args.dp_size,
        global_batch_size=args.global_batch_size,
        row_group_rows=args.row_group_rows,
        **figures,
    )
    bench_record.save(result, args.results, f"ray-cluster-{args.samples}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

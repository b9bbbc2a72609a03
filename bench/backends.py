"""Per-step wall time of a Dagster materialization on each backend, with its breakdown.

    .venv/bin/python bench/backends.py --ray-address http://127.0.0.1:8265 [--repeats 3]

For the embedded step 1 (`data/rollouts`) and a generated 32k-sample step: the CLI build
(`rollout-shards build`, a whole process), then one materialization of the step's three
assets per backend (in process, subprocess, Ray), repeats interleaved, medians printed.
The breakdown of one run, from the Dagster event log: `start` from the Dagster step's start
to the worker's first Pipes message (in process: to the first stage's log line), `work`
from there to the last stage's log line, `tail` from there to the step's success (Ray:
from the Ray job's end, as Ray records it, since the log lines arrive in batches). Then a
4-step backfill: four `dagster job execute` runs of the embedded steps launched at once,
timed from launch to the last exit, `--repeats` times interleaved across backends: in
process, Ray with one job per step, and Ray with a warm job (`ray.warm_worker_s`) that takes
the backfill's steps as they come. Shards of every backend are compared byte for byte with
the in-process ones (the backfill's too). Without `--ray-address` the Ray rows are left out;
`--backfill-only` times the backfill alone; `--json PATH` writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
EMBEDDED = ROOT / "data" / "rollouts"
BACKENDS = ("in_process", "subprocess", "ray")
OPENED = "[pipes] external process successfully opened dagster pipes."


def _environment(input_root: Path, output_root: Path) -> None:
    os.environ["ROLLOUT_SHARDS_INPUT"] = str(input_root)
    os.environ["ROLLOUT_SHARDS_OUTPUT"] = str(output_root)
    os.environ.pop("ROLLOUT_SHARDS_CONFIG", None)


def _compute(backend: str, ray_address: str | None) -> Any:
    from pipeline.orchestration.compute import Compute, RayCompute, StepCompute

    ray = RayCompute(
        address=ray_address,
        entrypoint=f"{PYTHON} -m pipeline.orchestration.pipes_worker",
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    )
    return StepCompute(compute=Compute(backend), ray=ray)


def _breakdown(result: Any, instance: Any, backend: str, ray_address: str | None) -> dict:
    records = instance.all_logs(result.run_id)
    step_start = next(
        r.timestamp
        for r in records
        if r.dagster_event is not None and r.dagster_event.event_type_value == "STEP_START"
    )
    step_end = next(
        r.timestamp
        for r in records
        if r.dagster_event is not None and r.dagster_event.event_type_value == "STEP_SUCCESS"
    )
    messages = [(r.timestamp, r.user_message) for r in records]
    if backend == "in_process":
        first = next(t for t, m in messages if " rows read, " in m)
    else:
        first = next(t for t, m in messages if m == OPENED)
    last = next(t for t, m in reversed(messages) if " rows written to " in m)
    tail_from = last
    if backend == "ray":
        from ray.job_submission import JobSubmissionClient

        event = next(
            e
            for e in result.get_asset_materialization_events()
            if "Ray Job ID" in e.materialization.metadata
        )
        job_id = event.materialization.metadata["Ray Job ID"].value
        tail_from = JobSubmissionClient(ray_address).get_job_info(job_id).end_time / 1000
    return {
        "start": first - step_start,
        "work": last - first,
        "tail": step_end - tail_from,
        "step": step_end - step_start,
    }


def materialize_once(
    input_root: Path, out: Path, key: str, backend: str, ray_address: str | None, config: dict
) -> dict[str, Any]:
    """One materialization of the step's three assets (no checks), wall time and breakdown."""
    import dagster as dg

    from pipeline.definitions import defs
    from pipeline.orchestration.partitions import rollout_steps
    from pipeline.orchestration.resources import RolloutStorage

    shutil.rmtree(out, ignore_errors=True)
    _environment(input_root, out)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(rollout_steps.name, [key])
        started = time.perf_counter()
        result = dg.materialize(
            list(defs.assets or []),
            partition_key=key,
            instance=instance,
            resources={
                "rollout_storage": RolloutStorage.from_env(),
                "step_compute": _compute(backend, ray_address),
            },
            run_config={"ops": {"rollout_samples": {"config": config}}} if config else None,
        )
        wall = time.perf_counter() - started
        return {"wall": wall, **_breakdown(result, instance, backend, ray_address)}


def cli_once(input_root: Path, out: Path, config: dict) -> float:
    shutil.rmtree(out, ignore_errors=True)
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in config.items()]
    started = time.perf_counter()
    subprocess.run(
        [PYTHON, "-m", "pipeline.cli", "build", str(input_root), "--out", str(out), *flags],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    return time.perf_counter() - started


def _shards(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("rank=*.parquet"))}


def measure_step(
    name: str, input_root: Path, key: str, config: dict, args: argparse.Namespace
) -> list[str]:
    backends = [b for b in BACKENDS if b != "ray" or args.ray_address]
    work = Path(tempfile.mkdtemp(prefix="rs-backends-"))
    runs: dict[str, list[dict[str, Any]]] = {b: [] for b in backends}
    cli: list[float] = []
    identical: dict[str, bool] = {}
    step_folder = f"step={int(key)}"
    for _ in range(args.repeats):
        cli.append(cli_once(input_root, work / "cli", config))
        for backend in backends:
            runs[backend].append(
                materialize_once(input_root, work / backend, key, backend, args.ray_address, config)
            )
    reference = _shards(work / "cli" / step_folder)
    for backend in backends:
        identical[backend] = _shards(work / backend / step_folder) == reference
    shutil.rmtree(work, ignore_errors=True)
    lines = [f"{name}: CLI build {statistics.median(cli):.2f} s (median of {len(cli)})"]
    for backend in backends:
        med = {k: statistics.median(r[k] for r in runs[backend]) for k in runs[backend][0]}
        lines.append(
            f"{name}: {backend:<10} wall {med['wall']:.2f} s  (start {med['start']:.2f}, "
            f"work {med['work']:.2f}, tail {med['tail']:.2f})  shards identical to CLI: "
            f"{identical[backend]}"
        )
    return lines


# A warm job waits this long for the next step: less than one in-process backfill, so a
# repeat of the Ray backfill starts its own warm job.
WARM_WORKER_S = 5.0


def backfill(backend: str, args: argparse.Namespace) -> tuple[float, dict[str, bytes]]:
    """Four runs of the embedded steps launched at once, as the daemon launches a backfill;
    the wall time and every rank file written."""
    import dagster as dg

    from pipeline.orchestration.partitions import rollout_steps

    work = Path(tempfile.mkdtemp(prefix="rs-backfill-"))
    home = work / "home"
    home.mkdir()
    keys = ["00000001", "00000002", "00000003", "00000004"]
    compute = "ray" if backend.startswith("ray") else backend
    resources: dict[str, Any] = {"step_compute": {"config": {"compute": compute}}}
    if compute == "ray":
        resources["step_compute"]["config"]["ray"] = {
            "address": args.ray_address,
            "entrypoint": f"{PYTHON} -m pipeline.orchestration.pipes_worker",
            "runtime_env": {"env_vars": {"PYTHONPATH": str(ROOT)}},
            "warm_worker_s": WARM_WORKER_S if backend == "ray_warm" else 0.0,
        }
    config = work / "run_config.yaml"
    config.write_text(json.dumps({"resources": resources}))
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "ROLLOUT_SHARDS_INPUT": str(EMBEDDED),
        "ROLLOUT_SHARDS_OUTPUT": str(work / "shards"),
        "PYTHONPATH": str(ROOT),
    }
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        instance.add_dynamic_partitions(rollout_steps.name, keys)
    dagster = str(Path(PYTHON).with_name("dagster"))
    started = time.perf_counter()
    runs = [
        subprocess.Popen(
            [
                dagster,
                *("job", "execute", "-m", "pipeline.definitions", "-j", "rollout_step_job"),
                *("--tags", json.dumps({"dagster/partition": key}), "-c", str(config)),
            ],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for key in keys
    ]
    codes = [run.wait() for run in runs]
    wall = time.perf_counter() - started
    shards = {
        str(path.relative_to(work / "shards")): path.read_bytes()
        for path in sorted((work / "shards").glob("step=*/rank=*.parquet"))
    }
    shutil.rmtree(work, ignore_errors=True)
    if any(codes):
        raise SystemExit(f"backfill on {backend}: exit codes {codes}")
    return wall, shards


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ray-address", help="Ray dashboard (http://127.0.0.1:8265)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--samples", type=int, default=32768, help="size of the big step")
    parser.add_argument("--skip-big", action="store_true", help="only the embedded step")
    parser.add_argument("--backfill-only", action="store_true", help="only the backfill")
    parser.add_argument("--json", type=Path, help="write the figures to this JSON file")
    parser.add_argument(
        "--ray-backfills",
        nargs="*",
        default=["ray", "ray_warm"],
        choices=["ray", "ray_warm"],
        help="the Ray backfills to time beside the in-process one",
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    load_before = os.getloadavg()
    lines: list[str] = []
    if not args.backfill_only:
        lines += measure_step("embedded step 1", EMBEDDED, "00000001", {}, args)
    if not args.skip_big and not args.backfill_only:
        big = Path(tempfile.mkdtemp(prefix="rs-big-"))
        subprocess.run(
            [PYTHON, ROOT / "bench" / "generate.py", "--samples", str(args.samples), "--out", big]
            + ["--steps", "1"],
            check=True,
            capture_output=True,
        )
        config = {"global_batch_size": 256, "dp_size": 2}
        lines += measure_step(f"{args.samples}-sample step", big, "00000000", config, args)
        shutil.rmtree(big, ignore_errors=True)
    backends = ["in_process", *(args.ray_backfills if args.ray_address else [])]
    walls: dict[str, list[float]] = {backend: [] for backend in backends}
    identical: dict[str, bool] = dict.fromkeys(backends, True)
    for _ in range(args.repeats):
        reference: dict[str, bytes] | None = None
        for backend in backends:
            wall, shards = backfill(backend, args)
            walls[backend].append(wall)
            reference = shards if reference is None else reference
            identical[backend] = identical[backend] and bool(shards) and shards == reference
    medians = {backend: statistics.median(runs) for backend, runs in walls.items()}
    for backend, runs in walls.items():
        spread = ", ".join(f"{wall:.2f}" for wall in runs)
        ratio = medians[backend] / medians["in_process"]
        lines.append(
            f"4-step backfill, {backend}: {medians[backend]:.2f} s = {ratio:.2f}x in process "
            f"(median of {len(runs)}, interleaved: {spread}); shards identical to in process: "
            f"{identical[backend]}"
        )
    print("\n".join(lines))
    if args.json is not None:
        record = {
            "when": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": " ".join(
                ["bench/backends.py", *(argv if argv is not None else sys.argv[1:])]
            ),
            "machine": {
                "cpus": os.cpu_count(),
                "load_average_before": load_before,
                "load_average_after": os.getloadavg(),
            },
            "ray_head": "one node on 127.0.0.1, --num-cpus=1" if args.ray_address else None,
            "warm_worker_s": WARM_WORKER_S,
            "backfill_4_steps": {
                backend: {
                    "median_s": round(medians[backend], 3),
                    "runs_s": [round(wall, 3) for wall in walls[backend]],
                    "ratio_to_in_process": round(medians[backend] / medians["in_process"], 3),
                    "shards_identical_to_in_process": identical[backend],
                }
                for backend in backends
            },
            "lines": lines,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

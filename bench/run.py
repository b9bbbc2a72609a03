"""The benchmark of issues 6 and 33 in one command: `rollout-shards build` against the I/O
floor, in time and peak RSS.

    .venv/bin/python bench/run.py              # everything: 6-10 min on 2 cores, once generated
    .venv/bin/python bench/run.py --quick      # 8k and 32k samples only, no big step

Generates steps with bench/generate.py (cached under --work), then times whole processes,
median of --repeats runs, interleaved so that load from other work hits every tool alike,
each on a settled machine (`settle`: synced, the step's files in the page cache):

- (a) floor: Polars reads the step and writes it back with the pipeline's Parquet options;
- (b) build: `rollout-shards build` (read, validate, plan, write ranks, hashes, manifest);
- (c) miles: bench/miles_path.py, the per-sample Python path of the trainer;
- (d) duckdb: bench/duckdb_path.py, the common non-compact path in DuckDB SQL (non-compact
  steps only: it knows no compact batches);
- (e) least: bench/least_build.py, the floor plus what the contract adds to it (the input's
  and each rank file's sha256, fsync), the step held whole: no build is faster, so a time
  goal below e/a cannot be met.

A 64-sample step (floor and build, `--small-samples`) gives the fixed cost per process.

Then one floor and one build of a big step (`--big-samples`, 512k samples, ~490M tokens:
time and peak RSS), and the Dagster path: one partition materialized in process
(`dg.materialize` of the three assets, as the CLI builds it; then with their asset checks,
which read the committed step again) against the CLI on the same step. Peak RSS and CPU
time are each child's own (`os.wait4`); the table puts the build's beside the floor's.

Every step's shards are checked byte for byte (`--no-identity`: not): the rank files of
the last timed build against those of a build holding the whole step in memory and of one
holding a rank at a time (`--stream-above` at either end), each run once. Then the goals
of issues 6, 13 and 33, one pass/fail line each.

The table goes between the markers of bench/results/build.md, the raw figures (with the
goals) to <work>/results.json; a run worth keeping goes to bench/results/
(bench/results/README.md).

The module imports only the standard library at the top: it is also the program of the
floor and Dagster children (`bench/run.py _floor ...`), whose start-up it must not slow.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PYTHON = Path(sys.executable)
CLI = PYTHON.parent / "rollout-shards"
GENERATOR = ROOT / "bench" / "generate.py"
MILES_PATH = ROOT / "bench" / "miles_path.py"
DUCKDB_PATH = ROOT / "bench" / "duckdb_path.py"
REPORT = ROOT / "bench" / "results" / "build.md"
BEGIN = "<!-- bench/run.py: begin -->"
END = "<!-- bench/run.py: end -->"
KINDS = ("non-compact", "compact")
FLOOR, BUILD, MILES, BEFORE, DUCKDB = "floor", "build", "miles", "before", "duckdb"
LEAST = "least"
LEAST_BUILD = ROOT / "bench" / "least_build.py"
RANK_FILES = "step=*/rank=*.parquet"
# `rollout-shards build --stream-above MIB`: above every bench step, the build holds the
# whole step in memory; at 0 it holds the per-token lists one part or one rank at a time.
IN_MEMORY, BOUNDED = ("in-memory", "100000"), ("bounded", "0")
# The goals the run is judged by (issues 6, 13 and 33).
GOAL_RSS_SAMPLES, GOAL_RSS_DP, GOAL_RSS_RATIO = 131072, 8, 0.5
GOAL_BIG_SAMPLES, GOAL_BIG_MIB = 524288, 2048.0
GOAL_TIME = {8192: 1.1, 32768: 0.85, 131072: 0.8}
GOAL_RSS_MIB = {32768: 560.0}
GOAL_FIXED_S, GOAL_DAGSTER_S = 0.15, 0.5
# The fixed-cost step's global batch size, at most (its 64 samples fill 2 optimizer steps).
SMALL_GLOBAL_BATCH = 32


@dataclass
class Run:
    """One child process: wall seconds, CPU seconds (user + system), peak RSS in MiB, and
    of the CPU seconds the system's, and the minor page faults."""

    wall: float
    cpu: float
    rss: float
    system: float = 0.0
    faults: int = 0


@dataclass
class Case:
    kind: str
    samples: int
    tokens: int
    input_mib: float
    dp: int = 0
    runs: dict[str, list[Run]] = field(default_factory=dict)
    # the byte-identity check of its rank files (`identity`), when run
    identity: dict[str, Any] | None = None

    def median(self, tool: str, what: str) -> float | None:
        runs = self.runs.get(tool)
        return statistics.median(getattr(r, what) for r in runs) if runs else None


def settle(inputs: Path) -> None:
    """Before a timed run: nothing left for the kernel to write back from the runs before,
    and the step's files read into the page cache. This VM's memory reclaim (kdamond)
    evicts pages of files left alone for a while (8-22% of the steps' pages between two
    runs), so an untouched input made a run wait on the disk at random."""
    os.sync()
    for path in sorted(inputs.rglob("*")):
        if path.is_file():
            with path.open("rb") as handle:
                while handle.read(1 << 23):
                    pass


def timed(
    cmd: Sequence[str | Path],
    log: Path,
    env: dict[str, str] | None = None,
    inputs: Path | None = None,
) -> Run:
    """Run a command to completion (on settled `inputs`); its own wall time, CPU time and
    peak RSS."""
    if inputs is not None:
        settle(inputs)
    with log.open("w") as out:
        started = time.perf_counter()
        proc = subprocess.Popen(
            [str(part) for part in cmd], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env
        )
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(
            f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{log.read_text()}"
        )
    # ru_maxrss is in KiB on Linux
    return Run(
        wall=wall,
        cpu=usage.ru_utime + usage.ru_stime,
        rss=usage.ru_maxrss / 1024,
        system=usage.ru_stime,
        faults=usage.ru_minflt,
    )


def generate(work: Path, kind: str, samples: int, mean_tokens: float, fresh: bool) -> Path:
    """A one-step input folder, generated once per (kind, size, mean tokens)."""
    folder = work / "inputs" / f"{kind}-{samples}-{mean_tokens:g}"
    stamp = folder / "generated.json"
    if stamp.exists() and not fresh:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    cmd = [PYTHON, GENERATOR, "--samples", samples, "--mean-tokens", mean_tokens, "--out", folder]
    if kind == "non-compact":
        cmd.append("--non-compact")
    print(f"generating {kind} step of {samples} samples ...", file=sys.stderr, flush=True)
    log = work / "generate.log"
    timed([*cmd, "--steps", "1"], log)
    tokens = re.search(r"(\d+) tokens", log.read_text())
    if tokens is None:
        raise SystemExit(f"no token count in {log}")
    stamp.write_text(json.dumps({"tokens": int(tokens.group(1))}))
    return folder


def tool_command(tool: str, step_dir: Path, out: Path, args: argparse.Namespace) -> list[Any]:
    settings = ["--global-batch-size", args.global_batch_size, "--dp-size", args.dp_size]
    if tool == FLOOR:
        return [PYTHON, __file__, "_floor", step_dir / "step=0.parquet", out / "floor.parquet"]
    if tool == BUILD:
        return [CLI, "build", step_dir, "--out", out, *settings]
    if tool == BEFORE:
        # -P keeps the working directory off sys.path, so PYTHONPATH picks the source tree
        return [PYTHON, "-P", "-m", "pipeline.cli", "build", step_dir, "--out", out, *settings]
    if tool == DUCKDB:
        return [PYTHON, DUCKDB_PATH, step_dir, "--out", out, *settings]
    if tool == LEAST:
        return [PYTHON, LEAST_BUILD, step_dir / "step=0.parquet", out / "least", args.dp_size]
    # (c) writes zstd like the pipeline, so codecs do not decide the comparison
    return [PYTHON, MILES_PATH, step_dir, "--out", out, *settings, "--compression", "zstd"]


def measure(case: Case, step_dir: Path, tools: Sequence[str], args: argparse.Namespace) -> None:
    """Time each tool `args.repeats` times, interleaved; then, unless `--no-identity`,
    check the last build's rank files byte for byte (`identity`)."""
    out = args.work / "out"
    kept = args.work / "identity" / "build"
    shutil.rmtree(kept, ignore_errors=True)
    for repeat in range(args.repeats):
        for tool in tools:
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            env = None
            if tool == BEFORE:
                env = {**os.environ, "PYTHONPATH": str(args.before)}
            command = tool_command(tool, step_dir, out, args)
            run = timed(command, args.work / f"{tool}.log", env=env, inputs=step_dir)
            case.runs.setdefault(tool, []).append(run)
            print(
                f"  {case.kind} {case.samples}: {tool} run {repeat + 1}: {run.wall:.2f} s, "
                f"{run.cpu:.2f} cpu-s, {run.rss:.0f} MiB",
                file=sys.stderr,
                flush=True,
            )
            if tool == BUILD and repeat == args.repeats - 1 and args.identity:
                kept.parent.mkdir(parents=True, exist_ok=True)
                out.rename(kept)
    shutil.rmtree(out, ignore_errors=True)
    if args.identity and kept.is_dir():
        case.identity = identity(case, step_dir, kept, args)
        shutil.rmtree(kept, ignore_errors=True)


def rank_digests(root: Path) -> dict[str, str]:
    """sha256 of each rank file under an output root, by its path in the root."""
    import hashlib

    digests = {}
    for path in sorted(root.glob(RANK_FILES)):
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            while chunk := handle.read(1 << 23):
                digest.update(chunk)
        digests[str(path.relative_to(root))] = digest.hexdigest()
    return digests


def identity(case: Case, step_dir: Path, kept: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The rank files of the timed build (`kept`, the default path for the step's size)
    against those of the in-memory and of the rank-bounded build of the same step, each
    run once; their time and peak RSS beside."""
    digests = {BUILD: rank_digests(kept)}
    runs = {}
    for label, above in (IN_MEMORY, BOUNDED):
        out = args.work / "identity" / label
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        command = [*tool_command(BUILD, step_dir, out, args), "--stream-above", above]
        runs[label] = timed(command, args.work / f"identity-{label}.log", inputs=step_dir)
        digests[label] = rank_digests(out)
        shutil.rmtree(out, ignore_errors=True)
    reference = digests[IN_MEMORY[0]]
    differing = sorted(
        f"{label}: {name}"
        for label, files in digests.items()
        for name in reference.keys() | files.keys()
        if files.get(name) != reference.get(name)
    )
    result = {
        "rank_files": len(reference),
        "compared": list(digests),
        "identical": bool(reference) and not differing,
        "differing": differing,
        "runs": {label: asdict(run) for label, run in runs.items()},
    }
    print(
        f"  {case.kind} {case.samples}: {len(reference)} rank files, build, in-memory and "
        f"bounded {'identical' if result['identical'] else 'DIFFER: ' + ', '.join(differing)}; "
        + ", ".join(f"{k} {r.wall:.2f} s {r.rss:.0f} MiB" for k, r in runs.items()),
        file=sys.stderr,
        flush=True,
    )
    return result


def floor_main(source: str, target: str) -> int:
    """Child (a): read the step and write it back with the pipeline's Parquet options."""
    import polars as pl

    options = json.loads(os.environ["BENCH_PARQUET_OPTIONS"])
    pl.read_parquet(source).write_parquet(target, **options)
    return 0


def dagster_main(input_root: str, output_root: str, gbs: str, dp: str, checks: str) -> int:
    """Child: materialize one partition's three assets in process, with their asset checks
    (`checks` "1") or without (the work of the CLI); print the phases."""
    started = time.perf_counter()
    os.environ["ROLLOUT_SHARDS_INPUT"] = input_root
    os.environ["ROLLOUT_SHARDS_OUTPUT"] = output_root
    os.environ.pop("ROLLOUT_SHARDS_CONFIG", None)
    import dagster as dg

    from pipeline.definitions import defs
    from pipeline.orchestration.partitions import partition_key, rollout_steps

    imported = time.perf_counter()
    key = partition_key(0)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(rollout_steps.name, [key])
        config = {"global_batch_size": int(gbs), "dp_size": int(dp)}
        materialize_started = time.perf_counter()
        result = dg.materialize(
            list(defs.assets or []),
            partition_key=key,
            instance=instance,
            resources=dict(defs.resources or {}),
            run_config={"ops": {"rollout_samples": {"config": config}}},
            selection=dg.AssetSelection.all()
            if checks == "1"
            else dg.AssetSelection.all() - dg.AssetSelection.all_asset_checks(),
        )
        materialized = time.perf_counter()
        steps = {
            event.step_key: event.event_specific_data.duration_ms / 1000  # type: ignore[union-attr]
            for event in result.all_events
            if event.event_type_value == "STEP_SUCCESS"
        }
    print(
        json.dumps(
            {
                "import": imported - started,
                "materialize": materialized - materialize_started,
                "steps": steps,
            }
        )
    )
    return 0 if result.success else 1


def measure_dagster(step_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The CLI and the in-process Dagster materialization of the same step, interleaved:
    the assets alone (the CLI's work: the goal) and with their asset checks (which read the
    committed step again: a UI materialization runs them)."""
    out = args.work / "out"
    cli: list[Run] = []
    dagster: list[Run] = []
    phases: list[dict[str, Any]] = []
    checked: list[dict[str, Any]] = []
    log = args.work / "dagster.log"

    def materialize(checks: str) -> tuple[Run, dict[str, Any]]:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        cmd = [PYTHON, __file__, "_dagster", step_dir, out, args.global_batch_size, args.dp_size]
        run = timed([*cmd, checks], log, inputs=step_dir)
        return run, json.loads(log.read_text().strip().splitlines()[-1])

    for repeat in range(args.repeats):
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        build = tool_command(BUILD, step_dir, out, args)
        cli.append(timed(build, args.work / "build.log", inputs=step_dir))
        run, phase = materialize("0")
        dagster.append(run)
        phases.append(phase)
        checked.append(materialize("1")[1])
        print(
            f"  dagster run {repeat + 1}: cli {cli[-1].wall:.2f} s, dagster process "
            f"{dagster[-1].wall:.2f} s, materialize {phases[-1]['materialize']:.2f} s, with "
            f"the asset checks {checked[-1]['materialize']:.2f} s",
            file=sys.stderr,
            flush=True,
        )
    shutil.rmtree(out, ignore_errors=True)
    step_names = sorted({name for p in phases for name in p["steps"]})
    return {
        "with_checks": statistics.median(p["materialize"] for p in checked),
        "cli": statistics.median(r.wall for r in cli),
        "cli_rss": statistics.median(r.rss for r in cli),
        "process": statistics.median(r.wall for r in dagster),
        "process_rss": statistics.median(r.rss for r in dagster),
        "import": statistics.median(p["import"] for p in phases),
        "materialize": statistics.median(p["materialize"] for p in phases),
        "steps": {n: statistics.median(p["steps"].get(n, 0.0) for p in phases) for n in step_names},
    }


def machine() -> dict[str, str]:
    import importlib.metadata as md

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    versions = ", ".join(
        f"{name} {md.version(name)}"
        for name in ("polars", "pyarrow", "pandera", "numpy", "dagster")
    )
    return {
        "cpus": str(os.cpu_count()),
        "memory": f"{memory:.1f} GiB",
        "cpu": cpu,
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "versions": versions,
    }


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def ratio(top: float | None, bottom: float | None) -> str:
    return "-" if top is None or bottom is None else f"{top / bottom:.2f}"


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least squares y = a + b x: intercept and slope."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    return my - slope * mx, slope


def build_path(case: Case, info: dict[str, Any]) -> str:
    """The path the default build takes for the step: the whole step in memory, or its
    per-token lists one part or one rank at a time (inputs above `--stream-above`)."""
    return "bounded" if case.input_mib > info["stream_above_mib"] else "in memory"


def goals(
    cases: list[Case],
    big: Case | None,
    small: Case | None,
    dagster: dict[str, Any] | None,
) -> list[dict[str, Any]]:
    """Each goal of issues 6, 13 and 33 with the run's figure and whether it holds (None:
    not measured in this run)."""
    found: list[dict[str, Any]] = []

    def goal(text: str, figure: str, passed: bool | None) -> None:
        found.append({"goal": text, "figure": figure, "pass": passed})

    for case in cases:
        floor_rss, build_rss = case.median(FLOOR, "rss"), case.median(BUILD, "rss")
        if case.samples == GOAL_RSS_SAMPLES and floor_rss and build_rss:
            at = f"dp {case.dp}" + ("" if case.dp == GOAL_RSS_DP else f", not {GOAL_RSS_DP}")
            goal(
                f"{case.kind} {case.samples // 1024}k ({at}): build peak RSS <= "
                f"{GOAL_RSS_RATIO}x the floor's",
                f"{build_rss:.0f} / {floor_rss:.0f} MiB = {build_rss / floor_rss:.3f}x",
                build_rss <= GOAL_RSS_RATIO * floor_rss if case.dp == GOAL_RSS_DP else None,
            )
    if big is not None and (rss := big.median(BUILD, "rss")) is not None:
        wall, floor = big.median(BUILD, "wall"), big.median(FLOOR, "wall")
        goal(
            f"{big.kind} {big.samples // 1024}k ({big.tokens / 1e6:.0f}M tokens): build peak "
            f"RSS <= {GOAL_BIG_MIB:.0f} MiB",
            f"{rss:.0f} MiB (floor {fmt(big.median(FLOOR, 'rss'), 0)} MiB); build {fmt(wall)} s,"
            f" floor {fmt(floor)} s, b/a {ratio(wall, floor)}",
            rss <= GOAL_BIG_MIB if big.samples >= GOAL_BIG_SAMPLES else None,
        )
    for case in cases:
        limit = GOAL_TIME.get(case.samples)
        a, b = case.median(FLOOR, "wall"), case.median(BUILD, "wall")
        e = case.median(LEAST, "wall")
        if limit is not None and a and b:
            least = f" (the least build: {e / a:.3f})" if e else ""
            goal(
                f"{case.kind} {case.samples // 1024}k: build/floor time <= {limit}",
                f"{b:.2f} / {a:.2f} s = {b / a:.3f}{least}",
                b / a <= limit,
            )
    for case in cases:
        limit_mib = GOAL_RSS_MIB.get(case.samples)
        if limit_mib is not None and (rss := case.median(BUILD, "rss")) is not None:
            goal(
                f"{case.kind} {case.samples // 1024}k: build peak RSS <= {limit_mib:.0f} MiB",
                f"{rss:.0f} MiB",
                rss <= limit_mib,
            )
    if (
        small is not None
        and (b := small.median(BUILD, "wall"))
        and (a := small.median(FLOOR, "wall"))
    ):
        goal(
            f"{small.samples}-sample step: build - floor <= {GOAL_FIXED_S} s",
            f"{b:.2f} - {a:.2f} = {b - a:+.2f} s",
            b - a <= GOAL_FIXED_S,
        )
    if dagster is not None:
        extra = dagster["materialize"] - dagster["cli"]
        goal(
            f"Dagster in process: `dg.materialize` of the assets - CLI <= {GOAL_DAGSTER_S} s",
            f"{dagster['materialize']:.2f} - {dagster['cli']:.2f} = {extra:+.2f} s",
            extra <= GOAL_DAGSTER_S,
        )
    checked = [c for c in [*cases, big, small] if c is not None and c.identity is not None]
    if checked:
        differing = [f"{c.kind} {c.samples}" for c in checked if not c.identity["identical"]]
        goal(
            "every step's rank files byte-identical: timed build, in-memory, bounded",
            f"{len(checked) - len(differing)} of {len(checked)} steps identical"
            + (f" (differ: {', '.join(differing)})" if differing else ""),
            not differing,
        )
    return found


def goal_lines(found: list[dict[str, Any]]) -> list[str]:
    verdict = {True: "PASS", False: "FAIL", None: "n/a "}
    return [f"- {verdict[g['pass']]} {g['goal']}: {g['figure']}" for g in found]


def report(
    cases: list[Case],
    big: Case | None,
    small: Case | None,
    dagster: dict[str, Any] | None,
    info: dict[str, Any],
    args: argparse.Namespace,
) -> str:
    lines = [
        f"Measured {info['date']} by `{info['command']}` in {info['minutes']:.1f} min: "
        f"{info['machine']['cpus']} CPUs ({info['machine']['cpu']}), "
        f"{info['machine']['memory']}, {info['machine']['system']}, Python "
        f"{info['machine']['python']}; {info['machine']['versions']}. Load average "
        f"{info['load_before']:.2f} before, {info['load_after']:.2f} after (other work shares "
        "the machine). Times are wall seconds of whole processes, median of "
        f"{args.repeats}, interleaved; RSS is each process's peak; global batch size "
        f"{args.global_batch_size}, {args.dp_size} ranks (dp), ~{args.mean_tokens:g} tokens per "
        "sample with rollout log probs. The build holds a step whose input files exceed "
        f"{info['stream_above_mib']:.0f} MiB one part or one rank at a time (path `bounded`), "
        "a smaller one whole (`in memory`)."
        + ("" if info["duckdb"] else " (d) not run: duckdb is not installed."),
        "",
        "| step | samples | tokens | input MiB | dp | build path | (a) floor s | (b) build s "
        "| (c) miles s | (d) duckdb s | (e) least s | b/a | b/a cpu | e/a | c/b | d/b | (a) MiB "
        "| (b) MiB | b/a MiB | (c) MiB | (b) s per M tokens |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:"
        "|---:|---:|---:|---:|",
    ]
    for case in cases:
        a, b, cc, d, e = (case.median(t, "wall") for t in (FLOOR, BUILD, MILES, DUCKDB, LEAST))
        a_rss, b_rss = case.median(FLOOR, "rss"), case.median(BUILD, "rss")
        lines.append(
            f"| {case.kind} | {case.samples} | {case.tokens / 1e6:.1f}M | {case.input_mib:.0f} "
            f"| {case.dp} | {build_path(case, info)} "
            f"| {fmt(a)} | {fmt(b)} | {fmt(cc)} | {fmt(d)} | {fmt(e)} | {ratio(b, a)} "
            f"| {ratio(case.median(BUILD, 'cpu'), case.median(FLOOR, 'cpu'))} | {ratio(e, a)} "
            f"| {ratio(cc, b)} "
            f"| {ratio(d, b)} "
            f"| {fmt(a_rss, 0)} | {fmt(b_rss, 0)} | {ratio(b_rss, a_rss)} "
            f"| {fmt(case.median(MILES, 'rss'), 0)} "
            f"| {fmt(b / (case.tokens / 1e6) if b else None, 3)} |"
        )
    if any(BEFORE in case.runs for case in cases):
        lines += [
            "",
            f"Before, the build of `{args.before}` measured in the same rounds:",
            "",
            "| step | samples | before s | build s | before/build | before b/a | before MiB "
            "| build MiB |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for case in cases:
            a, b, b0 = (case.median(t, "wall") for t in (FLOOR, BUILD, BEFORE))
            lines.append(
                f"| {case.kind} | {case.samples} | {fmt(b0)} | {fmt(b)} | {ratio(b0, b)} "
                f"| {ratio(b0, a)} | {fmt(case.median(BEFORE, 'rss'), 0)} "
                f"| {fmt(case.median(BUILD, 'rss'), 0)} |"
            )
    lines += ["", "Scaling (least squares over the sizes, wall = fixed + per-token cost):", ""]
    for kind in KINDS:
        mine = [c for c in cases if c.kind == kind]
        if len(mine) < 2:
            continue
        for tool in (FLOOR, BUILD):
            xs = [c.tokens / 1e6 for c in mine]
            ys = [c.median(tool, "wall") or 0.0 for c in mine]
            fixed, slope = linear_fit(xs, ys)
            worst = max(abs(y - (fixed + slope * x)) / y for x, y in zip(xs, ys, strict=True))
            rss = [c.median(tool, "rss") or 0.0 for c in mine]
            lines.append(
                f"- {kind}, {tool}: {fixed:.2f} s + {slope * 1000:.1f} ms per M tokens "
                f"(largest deviation from the line {worst:.0%}); peak RSS "
                + " -> ".join(f"{r:.0f}" for r in rss)
                + f" MiB over {', '.join(f'{x:.0f}M' for x in xs)} tokens"
            )
    if small is not None:
        a, b = small.median(FLOOR, "wall"), small.median(BUILD, "wall")
        before = ""
        if BEFORE in small.runs:
            before = f"; the build of `{args.before}` {fmt(small.median(BEFORE, 'wall'))} s"
        lines += [
            "",
            f"Fixed cost ({small.kind}, {small.samples} samples, global batch size "
            f"{min(args.global_batch_size, SMALL_GLOBAL_BATCH)}, median of {args.repeats}): "
            f"build {fmt(b)} s ({fmt(small.median(BUILD, 'cpu'))} cpu-s, "
            f"{fmt(small.median(BUILD, 'rss'), 0)} MiB), floor {fmt(a)} s "
            f"({fmt(small.median(FLOOR, 'cpu'))} cpu-s): build - floor = "
            f"{(b or 0.0) - (a or 0.0):.2f} s{before}.",
        ]
    if big is not None:
        a, b = big.median(FLOOR, "wall"), big.median(BUILD, "wall")
        a_rss, b_rss = big.median(FLOOR, "rss"), big.median(BUILD, "rss")
        lines += [
            "",
            f"Big step ({big.kind}, {big.samples} samples, {big.tokens / 1e6:.0f}M tokens, "
            f"{big.input_mib:.0f} MiB of Parquet, dp {big.dp}, build path "
            f"{build_path(big, info)}), one run each: build {fmt(b)} s, {fmt(b_rss, 0)} MiB "
            f"peak RSS, {fmt(big.median(BUILD, 'cpu'))} cpu-s; floor {fmt(a)} s, "
            f"{fmt(a_rss, 0)} MiB; b/a {ratio(b, a)} in time, {ratio(b_rss, a_rss)} in peak "
            f"RSS; machine memory {info['machine']['memory']}.",
        ]
    checked = [c for c in [*cases, big, small] if c is not None and c.identity is not None]
    if checked:
        lines += [
            "",
            "Byte identity, per step: the rank files of the last timed build against those of "
            f"`--stream-above {IN_MEMORY[1]}` (in memory) and `--stream-above {BOUNDED[1]}` "
            "(bounded), each built once (wall s, peak RSS MiB):",
            "",
            "| step | samples | rank files | identical | in-memory s | in-memory MiB "
            "| bounded s | bounded MiB | bounded/in-memory MiB |",
            "|---|---:|---:|---|---:|---:|---:|---:|---:|",
        ]
        for case in checked:
            found = case.identity or {}
            memory, bounded = (found["runs"][label] for label in (IN_MEMORY[0], BOUNDED[0]))
            lines.append(
                f"| {case.kind} | {case.samples} | {found['rank_files']} "
                f"| {'yes' if found['identical'] else 'NO: ' + ', '.join(found['differing'])} "
                f"| {memory['wall']:.2f} | {memory['rss']:.0f} | {bounded['wall']:.2f} "
                f"| {bounded['rss']:.0f} | {bounded['rss'] / memory['rss']:.2f} |"
            )
    if dagster is not None:
        steps = ", ".join(f"{name} {value:.2f} s" for name, value in dagster["steps"].items())
        lines += [
            "",
            f"Dagster, {dagster['step']} step: the CLI takes {dagster['cli']:.2f} s "
            f"({dagster['cli_rss']:.0f} MiB); one partition materialized in process takes "
            f"{dagster['materialize']:.2f} s in `dg.materialize` ({steps}), "
            f"+{dagster['materialize'] - dagster['cli']:.2f} s over the whole CLI process, "
            f"{dagster['with_checks']:.2f} s with its six asset checks (a UI "
            "materialization's: they read the committed step again); the "
            f"whole Dagster process {dagster['process']:.2f} s ({dagster['process_rss']:.0f} MiB), "
            f"of which {dagster['import']:.2f} s importing dagster and the definitions.",
        ]
    lines += ["", "Goals:", "", *goal_lines(info["goals"])]
    return "\n".join(lines)


def write_report(table: str) -> None:
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    text = REPORT.read_text() if REPORT.exists() else f"# bench/run.py\n\n{BEGIN}\n{END}\n"
    if BEGIN not in text or END not in text:
        text = text.rstrip("\n") + f"\n\n## Latest run\n\n{BEGIN}\n{END}\n"
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    REPORT.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8192,32768,131072", help="samples per step")
    parser.add_argument("--mean-tokens", type=float, default=950.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--global-batch-size", type=int, default=256)
    parser.add_argument(
        "--dp-size",
        type=int,
        default=GOAL_RSS_DP,
        help="data-parallel ranks of every step (issue 33's memory goal at 128k is for dp 8)",
    )
    parser.add_argument(
        "--miles-max-samples",
        type=int,
        default=32768,
        help="run (c) only up to this size: it holds every token as a Python int (3 GB at 32k)",
    )
    parser.add_argument(
        "--big-samples",
        type=int,
        default=GOAL_BIG_SAMPLES,
        help="samples of the big step (compact, one run each; ~490M tokens at 512k); 0 skips it",
    )
    parser.add_argument(
        "--small-samples", type=int, default=64, help="the fixed-cost step; 0 skips it"
    )
    parser.add_argument("--dagster-samples", type=int, default=32768, help="0 skips Dagster")
    parser.add_argument("--quick", action="store_true", help="8k and 32k, no big step")
    parser.add_argument(
        "--no-identity",
        dest="identity",
        action="store_false",
        help="skip the byte-identity check of each step (two more builds per step)",
    )
    parser.add_argument(
        "--before",
        type=Path,
        help="also time the build of another source tree (say `git archive` of an older "
        "commit), interleaved with the others",
    )
    parser.add_argument("--fresh", action="store_true", help="regenerate the inputs")
    parser.add_argument("--no-report", action="store_true", help="write no report")
    parser.add_argument("--work", type=Path, default=ROOT / "bench" / "out")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.big_samples = "8192,32768", 0
    args.work = args.work.resolve()
    args.before = args.before.resolve() if args.before else None
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
    args.work.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    # The builds run as an installed package would, from bytecode: an editable source tree
    # has none where PYTHONDONTWRITEBYTECODE is set, and each process would compile it.
    import compileall  # here, not at the top: the floor's children import this module

    for tree in [ROOT / "pipeline", *([args.before / "pipeline"] if args.before else [])]:
        compileall.compile_dir(tree, quiet=1)
    from pipeline.io.writer import PARQUET_OPTIONS
    from pipeline.settings import setting_defaults
    from pipeline.speed import ALLOCATOR_CONF, ALLOCATOR_ENV

    os.environ["BENCH_PARQUET_OPTIONS"] = json.dumps(PARQUET_OPTIONS)
    # The floor reads and writes with the allocator settings a build gives Polars (unless
    # the user set their own): the same conditions, and a stricter floor than Polars'
    # defaults.
    os.environ.setdefault(ALLOCATOR_ENV, ALLOCATOR_CONF)
    import importlib.util

    # (d) needs the bench extra; without it the run goes on and the report says so
    duckdb = importlib.util.find_spec("duckdb") is not None
    if not duckdb:
        print("duckdb is not installed: (d) not run (pip install -e '.[bench]')", file=sys.stderr)
    load_before = os.getloadavg()[0]
    sizes = [int(s) for s in args.sizes.split(",")]
    cases = []
    for kind in KINDS:
        for samples in sizes:
            step_dir = generate(args.work, kind, samples, args.mean_tokens, args.fresh)
            case = Case(
                kind=kind,
                samples=samples,
                tokens=json.loads((step_dir / "generated.json").read_text())["tokens"],
                input_mib=(step_dir / "step=0.parquet").stat().st_size / 2**20,
                dp=args.dp_size,
            )
            tools = [FLOOR, LEAST, BUILD]
            tools += [MILES] if samples <= args.miles_max_samples else []
            tools += [DUCKDB] if kind == "non-compact" and duckdb else []
            tools += [BEFORE] if args.before else []
            measure(case, step_dir, tools, args)
            cases.append(case)
    big = None
    if args.big_samples > 0:
        samples = args.big_samples
        step_dir = generate(args.work, "compact", samples, args.mean_tokens, args.fresh)
        big = Case(
            kind="compact",
            samples=samples,
            tokens=json.loads((step_dir / "generated.json").read_text())["tokens"],
            input_mib=(step_dir / "step=0.parquet").stat().st_size / 2**20,
            dp=args.dp_size,
        )
        measure(big, step_dir, [FLOOR, BUILD], argparse.Namespace(**{**vars(args), "repeats": 1}))
    small = None
    if args.small_samples > 0:
        step_dir = generate(args.work, "compact", args.small_samples, args.mean_tokens, args.fresh)
        small = Case(
            kind="compact",
            samples=args.small_samples,
            tokens=json.loads((step_dir / "generated.json").read_text())["tokens"],
            input_mib=(step_dir / "step=0.parquet").stat().st_size / 2**20,
            dp=args.dp_size,
        )
        # a global batch the few rollouts fill: the build refuses a step it would train
        # nothing on (rule no_train_steps)
        settings = {"global_batch_size": min(args.global_batch_size, SMALL_GLOBAL_BATCH)}
        small_args = argparse.Namespace(**{**vars(args), **settings})
        measure(small, step_dir, [FLOOR, BUILD] + ([BEFORE] if args.before else []), small_args)
    dagster = None
    if args.dagster_samples > 0:
        step_dir = generate(args.work, "compact", args.dagster_samples, args.mean_tokens, False)
        dagster = measure_dagster(step_dir, args)
        dagster["step"] = f"compact {args.dagster_samples}-sample"
    info = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": "bench/run.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "minutes": (time.perf_counter() - began) / 60,
        "machine": machine(),
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "stream_above_mib": float(setting_defaults()["stream_above"]),
        "duckdb": duckdb,
        "goals": goals(cases, big, small, dagster),
    }
    table = report(cases, big, small, dagster, info, args)
    results = {
        "info": info,
        "cases": [asdict(c) for c in cases],
        "big": asdict(big) if big else None,
        "small": asdict(small) if small else None,
        "dagster": dagster,
    }
    (args.work / "results.json").write_text(json.dumps(results, indent=2))
    print(table)
    if not args.no_report:
        write_report(table)
        print(f"\nwritten to {REPORT.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_floor":
        sys.exit(floor_main(*sys.argv[2:4]))
    if len(sys.argv) > 1 and sys.argv[1] == "_dagster":
        sys.exit(dagster_main(*sys.argv[2:7]))
    sys.exit(main())

"""A/B of whole `rollout-shards build` processes: two or more source trees (or settings of
the environment) on one step, interleaved round by round, medians.

    .venv/bin/python bench/ab.py STEP_DIR --tree base=/tmp/base --tree new=. --rounds 30
    .venv/bin/python bench/ab.py STEP_DIR --tree a=. --tree b=. --env b:_RJEM_MALLOC_CONF=narenas:1
    .venv/bin/python bench/ab.py STEP_DIR --tree a=. --tree b=/tmp/b -- --global-batch-size 8

The build's settings follow `--` (default: --global-batch-size 256 --dp-size 8).

This machine's speed drifts by tens of percent within the hour, so a change of a few
percent shows only in many interleaved rounds (docs/performance.md): bench/run.py measures
the goals, this script one change. A tree is a folder holding `pipeline/` (say `git archive
HEAD pipeline | tar -x -C /tmp/base`); each is compiled to bytecode first, as an installed
package is. Standard library only.
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PYTHON = Path(sys.executable)


def run(
    tree: Path, env: dict[str, str], step: Path, out: Path, args: list[str]
) -> tuple[float, ...]:
    """One build in a fresh process: wall s, cpu s, system s, peak RSS MiB, minor faults."""
    shutil.rmtree(out, ignore_errors=True)
    command = [str(PYTHON), "-P", "-m", "pipeline.cli", "build", str(step), "--out", str(out)]
    environment = {**os.environ, **env, "PYTHONPATH": str(tree)}
    started = time.perf_counter()
    child = subprocess.Popen([*command, *args], stdout=subprocess.DEVNULL, env=environment)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command + args)} with PYTHONPATH={tree} failed")
    cpu = usage.ru_utime + usage.ru_stime
    return wall, cpu, usage.ru_stime, usage.ru_maxrss / 1024, float(usage.ru_minflt)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", type=Path, help="a step's input folder or file")
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=PATH")
    parser.add_argument("--env", action="append", default=[], metavar="NAME:KEY=VALUE")
    parser.add_argument("--rounds", type=int, default=20)
    argv = sys.argv[1:]
    build_args = ["--global-batch-size", "256", "--dp-size", "8"]
    if "--" in argv:  # after --: the build's settings
        argv, build_args = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    args = parser.parse_args(argv)
    trees = dict(spec.split("=", 1) for spec in args.tree)
    envs: dict[str, dict[str, str]] = {name: {} for name in trees}
    for spec in args.env:
        name, _, setting = spec.partition(":")
        key, _, value = setting.partition("=")
        envs[name][key] = value
    for path in set(trees.values()):
        compileall.compile_dir(Path(path) / "pipeline", quiet=1)
    runs: dict[str, list[tuple[float, ...]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "out"
        for _ in range(args.rounds):
            for name, path in trees.items():
                result = run(Path(path).resolve(), envs[name], args.step, out, build_args)
                runs[name].append(result)
    print(f"{args.step}, {args.rounds} rounds interleaved, medians (min wall):")
    for name, results in runs.items():
        wall, cpu, system, rss, faults = (
            statistics.median(r[i] for r in results) for i in range(5)
        )
        print(
            f"  {name:12s} {wall:.3f} s (min {min(r[0] for r in results):.3f}), {cpu:.3f} cpu-s "
            f"({system:.3f} system), {rss:.0f} MiB, {faults:.0f} minor faults"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

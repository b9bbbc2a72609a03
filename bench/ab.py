"""A/B of whole `rollout-shards build` processes: two or more source trees (or settings of
the environment) on one step, interleaved round by round, medians.

    .venv/bin/python bench/ab.py STEP_DIR --tree base=/tmp/base --tree new=. --rounds 30
    .venv/bin/python bench/ab.py STEP_DIR --tree a=. --tree b=. --env b:_RJEM_MALLOC_CONF=narenas:1
    .venv/bin/python bench/ab.py STEP_DIR --tree a=. --tree b=/tmp/b -- --global-batch-size 8
    .venv/bin/python bench/ab.py STEP_DIR --tree base=/tmp/base --tree new=. --json /tmp/ab.json

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
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from run import PYTHON, Run, timed  # bench/run.py, beside this script


def build(tree: Path, env: dict[str, str], step: Path, scratch: Path, args: list[str]) -> Run:
    """One build of `tree`'s package in a fresh process."""
    out = scratch / "out"
    command = [PYTHON, "-P", "-m", "pipeline.cli", "build", step, "--out", out, *args]
    environment = {**os.environ, **env, "PYTHONPATH": str(tree)}
    run = timed(command, scratch / "build.log", env=environment, inputs=step)
    shutil.rmtree(out, ignore_errors=True)
    return run


def median(runs: list[Run], what: str) -> float:
    return statistics.median(getattr(run, what) for run in runs)


def paired_ratio(runs: list[Run], against: list[Run]) -> tuple[float, int]:
    """The median of the rounds' wall-time ratios, and in how many rounds `runs` was faster."""
    ratios = [r.wall / a.wall for r, a in zip(runs, against, strict=True)]
    return round(statistics.median(ratios), 3), sum(ratio < 1 for ratio in ratios)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", type=Path, help="a step's input folder or file")
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=PATH")
    parser.add_argument("--env", action="append", default=[], metavar="NAME:KEY=VALUE")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", type=Path, help="also write the figures here")
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
    runs: dict[str, list[Run]] = {name: [] for name in trees}
    loads = []  # the 1-minute load average as each round starts, and at the end
    with tempfile.TemporaryDirectory() as scratch:
        names = list(trees)
        for round_ in range(args.rounds):
            loads.append(os.getloadavg()[0])
            # each round starts with the next tree, so that none always runs first
            shift = round_ % len(names)
            for name in names[shift:] + names[:shift]:
                tree = Path(trees[name]).resolve()
                runs[name].append(build(tree, envs[name], args.step, Path(scratch), build_args))
    loads.append(os.getloadavg()[0])
    load = f"{min(loads):.2f}-{max(loads):.2f} (median {statistics.median(loads):.2f})"
    print(f"{args.step}, {args.rounds} rounds interleaved, load average {load}, medians:")
    report: dict[str, object] = {"command": sys.argv, "rounds": args.rounds, "load": load}
    for index, (name, results) in enumerate(runs.items()):
        # the same round's builds of two trees ran within seconds of each other: their
        # ratio moves less with the machine's drift than either median does
        paired = {earlier: paired_ratio(results, runs[earlier]) for earlier in list(runs)[:index]}
        figures = {what: round(median(results, what), 3) for what in ("wall", "cpu", "system")}
        figures |= {"min_wall": round(min(r.wall for r in results), 3)}
        figures |= {"rss_mib": round(median(results, "rss")), "faults": median(results, "faults")}
        report[name] = figures | {f"against_{k}": v for k, v in paired.items()}
        against = "".join(
            f"; against {earlier}: median ratio {ratio:.3f}, faster in {faster} of {args.rounds}"
            for earlier, (ratio, faster) in paired.items()
        )
        print(
            f"  {name:12s} {figures['wall']:.3f} s (min {figures['min_wall']:.3f}), "
            f"{figures['cpu']:.3f} cpu-s ({figures['system']:.3f} system), "
            f"{figures['rss_mib']} MiB, {figures['faults']:.0f} minor faults{against}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
    runs: dict[str, list[Run]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as scratch:
        names = list(trees)
        for round_ in range(args.rounds):
            # each round starts with the next tree, so that none always runs first
            shift = round_ % len(names)
            for name in names[shift:] + names[:shift]:
                tree = Path(trees[name]).resolve()
                runs[name].append(build(tree, envs[name], args.step, Path(scratch), build_args))
    print(f"{args.step}, {args.rounds} rounds interleaved, medians (min wall):")
    first = runs[names[0]]
    for name, results in runs.items():
        # the same round's builds of two trees ran within seconds of each other: their
        # ratio moves less with the machine's drift than either median does
        ratios = [r.wall / f.wall for r, f in zip(results, first, strict=True)]
        faster = sum(ratio < 1 for ratio in ratios)
        paired = (
            f"; against {names[0]}: median ratio {statistics.median(ratios):.3f}, "
            f"faster in {faster} of {len(ratios)} rounds"
            if name != names[0]
            else ""
        )
        print(
            f"  {name:12s} {median(results, 'wall'):.3f} s "
            f"(min {min(r.wall for r in results):.3f}), {median(results, 'cpu'):.3f} cpu-s "
            f"({median(results, 'system'):.3f} system), {median(results, 'rss'):.0f} MiB, "
            f"{median(results, 'faults'):.0f} minor faults{paired}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

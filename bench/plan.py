"""`plan` over a grid of layouts against one `build` of the same step (docs/performance.md).

    python bench/plan.py STEP_FOLDER [--out results.json]

Times `rollout-shards plan` over a 3 x 2 grid of dp and cp sizes (six layouts, each step
read and checked once) and one `build` of one layout, each as a process, with the machine's
load average beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SETTINGS = ["--global-batch-size=512", "--use-dynamic-batch-size", "--max-tokens-per-gpu=16384"]
GRID = ["--dp-size=8,16,32", "--cp-size=1,2"]


def _timed(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args, "--quiet"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        figures = {
            # a record of a run (docs/performance.md): what was timed and how
            "what": "rollout-shards plan over six layouts against one build of one layout",
            "command": " ".join(["python", *sys.argv]),
            "plan_six_layouts_s": _timed(["plan", str(args.step), *SETTINGS, *GRID]),
            "build_one_layout_s": _timed(
                ["build", str(args.step), f"--out={tmp}", *SETTINGS, "--dp-size=8", "--cp-size=1"]
            ),
            "load_average": os.getloadavg(),
            "cores": os.cpu_count(),
        }
    text = json.dumps(figures, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()

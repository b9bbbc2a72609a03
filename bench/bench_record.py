"""What the records of the benchmarks run by hand (ray_tasks, cluster_shuffle,
stage_profile) start with, the command, when, the machine, the versions of the libraries
that decode and encode (a release moves every figure) and the load average before and
after, and where they go: `results/<UTC minute>-<name>.json`."""

from __future__ import annotations

import datetime
import json
import os
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

# The libraries whose release moves the figures: the decoders and encoders, and Ray's tasks.
VERSIONED = ("polars", "pyarrow", "ray")


def versions() -> dict[str, str]:
    """The installed version of each of `VERSIONED` (one not installed is left out)."""
    found = {}
    for name in VERSIONED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def record(
    script: str,
    argv: list[str] | None,
    machine: dict[str, Any],
    load_before: tuple[float, ...],
    **figures: Any,
) -> dict[str, Any]:
    """The record of `bench/<script>` run with `argv` (else this process's arguments)."""
    return {
        "command": " ".join(["python", f"bench/{script}", *(argv or sys.argv[1:])]),
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        **machine,
        "versions": versions(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        **figures,
    }


def save(result: dict[str, Any], results: Path, name: str, show: bool = True) -> Path:
    """`result` written as `results/<UTC minute>-<name>.json` (and printed, when `show`)."""
    results.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H%M")
    path = results / f"{stamp}-{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    if show:
        print(json.dumps(result, indent=2))
    return path

"""A backfill as the daemon runs one: one `dagster job execute` process per partition of the
project's definitions, all launched at once on one Dagster home (test_backfill,
test_compute_ray)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from pipeline.orchestration.compute import COMPUTE_ENV

DAGSTER = Path(sys.executable).with_name("dagster")
# Four run processes share two cores (and whatever else runs).
TIMEOUT_S = 400


def launch(key: str, config: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    command = [
        str(DAGSTER),
        *("job", "execute", "-m", "pipeline.definitions", "-j", "rollout_step_job"),
        *("--tags", json.dumps({"dagster/partition": key}), "-c", str(config)),
    ]
    with log.open("wb") as out:
        return subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def backfill(
    home: Path,
    tmp_path: Path,
    keys: list[str],
    compute: str | dict[str, str],
    resources: dict[str, Any] | None = None,
) -> None:
    """One run per partition, all launched at once; waits for every one (bounded). `compute`
    is every run's, or each partition's by key."""
    config = tmp_path / "run_config.yaml"
    config.write_text(yaml.safe_dump({"resources": resources or {}}))
    computes = compute if isinstance(compute, dict) else dict.fromkeys(keys, compute)
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    logs = {key: tmp_path / f"run-{key}.log" for key in keys}
    runs = {key: launch(key, config, env | {COMPUTE_ENV: computes[key]}, logs[key]) for key in keys}
    deadline = time.monotonic() + TIMEOUT_S
    try:
        for run in runs.values():
            run.wait(timeout=max(deadline - time.monotonic(), 0.1))
    finally:
        for run in runs.values():
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
    failed = {key: logs[key].read_text()[-3000:] for key, run in runs.items() if run.returncode}
    assert not failed, failed

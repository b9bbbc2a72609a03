"""A step whose rank files are written by Ray tasks (`pipeline.orchestration.ray_ranks`) on
the session's one-node Ray head: a driver process reads and plans, a Ray worker process
writes each rank, and the files are the bytes `rollout-shards build` writes.

The driver is a process of its own, as a user's driver script is, started with
`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`: the head listens on 127.0.0.1 only, and a driver
without it turns the address 127.0.0.1 into the machine's address (Ray reads the variable
when it is imported) and waits for a GCS that is not there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ray_head import RayHead, start_timeout

from pipeline.io.discovery import find_sources
from pipeline.io.load import group_steps
from pipeline.manifest import Manifest
from pipeline.settings import Settings
from pipeline.step.build import build_step
from tests.conftest import generated_step

REPO = Path(__file__).resolve().parents[2]
# balance_data: the ranks' rows are not in batch order, so each rank's writer reorders
# its spill files.
SETTINGS = {"global_batch_size": 64, "dp_size": 4, "balance_data": True}
RANKS = [f"rank={rank}.parquet" for rank in range(4)]

DRIVER = """
import json, os, sys
from pathlib import Path
import ray
from pipeline.io.discovery import find_sources
from pipeline.io.load import group_steps
from pipeline.orchestration.ray_ranks import build_step_on_ray
from pipeline.settings import Settings
from pipeline.step import bounded

# Whether the step took the rank-bounded path (its lists spilled), which the driver
# chooses up front from the stream_above setting.
routed = []
route = bounded.spilled
bounded.spilled = lambda batch, spill: routed.append(batch.step) or route(batch, spill)

inputs, out, settings, address, stream_above, timeout = sys.argv[1:]
built = build_step_on_ray(
    0,
    group_steps(find_sources([Path(inputs)]))[0],
    Settings(**json.loads(settings), stream_above=json.loads(stream_above)),
    Path(out),
    address=address,
    timeout_s=float(timeout),
)
print(json.dumps({
    "driver": os.getpid(),
    "connected": ray.is_initialized(),
    "routed": routed,
    "writers": [[w.name, w.host, w.pid] for w in built.writers],
}))
"""


def _driver(
    head: RayHead, inputs: Path, out: Path, stream_above: int | None, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Build step 0 of `inputs` into `out` with `build_step_on_ray` in a driver process."""
    env = {**os.environ, **head.environment(), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    env.pop("RAY_ADDRESS", None)
    arguments = [str(inputs), str(out), json.dumps(SETTINGS), head.address]
    return subprocess.run(
        [sys.executable, "-c", DRIVER, *arguments, json.dumps(stream_above), str(timeout)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=2 * start_timeout(),
    )


def _drive(head: RayHead, inputs: Path, out: Path, stream_above: int | None) -> dict[str, Any]:
    result = _driver(head, inputs, out, stream_above, start_timeout())
    assert result.returncode == 0, result.stderr[-3000:]
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


def _files(root: Path) -> dict[str, bytes]:
    return {name: (root / "step=0" / name).read_bytes() for name in RANKS}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generated_step(tmp_path_factory.mktemp("ray-ranks") / "in")


@pytest.mark.parametrize("stream_above", [0, None], ids=["spilled", "in-memory"])
def test_ray_tasks_write_the_bytes_of_the_build(
    ray_head: RayHead, inputs: Path, tmp_path: Path, stream_above: int | None
) -> None:
    sources = group_steps(find_sources([inputs]))[0]
    local = build_step(0, sources, Settings(**SETTINGS), tmp_path / "local")

    report = _drive(ray_head, inputs, tmp_path / "ray", stream_above)

    assert report["routed"] == ([0] if stream_above == 0 else [])
    on_ray = Manifest.read(tmp_path / "ray" / "step=0" / "manifest.json")
    assert on_ray is not None
    assert [o.path for o in on_ray.outputs] == RANKS
    assert on_ray.outputs == local.outputs  # names, rows, tokens and sha256
    assert on_ray.counts == local.counts
    assert _files(tmp_path / "ray") == _files(tmp_path / "local")
    # Each rank file was written by a Ray worker process, none by the driver.
    assert sorted(name for name, _, _ in report["writers"]) == RANKS
    assert all(pid != report["driver"] for _, _, pid in report["writers"])
    # The driver left Ray as it found it (not connected), and nothing private in the output
    # root: no spill folder, no staged step folder.
    assert report["connected"] is False
    assert sorted(p.name for p in (tmp_path / "ray").iterdir()) == sorted(
        p.name for p in (tmp_path / "local").iterdir()
    )


def test_ranks_that_miss_the_timeout_publish_nothing(
    ray_head: RayHead, inputs: Path, tmp_path: Path
) -> None:
    """Four rank files cannot be written in a millisecond: the tasks are cancelled, the step
    fails, and the output root holds no step folder, no staged folder and no spill."""
    result = _driver(ray_head, inputs, tmp_path / "ray", 0, 0.001)

    assert result.returncode == 1
    assert "GetTimeoutError" in result.stderr
    # the locks and the dataset card, which every build writes before its step
    assert sorted(p.name for p in (tmp_path / "ray").iterdir()) == [".locks", "README.md"]

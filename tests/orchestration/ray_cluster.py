"""A three-node Ray cluster on 127.0.0.1 for the tests (`ray.cluster_utils.Cluster`): a head
that runs no task (no CPU: the drivers attach to it) and two worker nodes, each with a
custom resource `rollout_worker` that the tests' tasks ask for, with Ray's token
authentication on.

The cluster runs in a process of its own, started with the token in its environment (Ray
reads its auth mode when it is imported, so the test process, which may have imported Ray
already, never joins it); the drivers are processes of their own too. Run as a script it
starts the cluster, writes its address and nodes to the state file it is given, and keeps
it up until it is sent SIGTERM.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.shared import shared as shared_service

REPO = Path(__file__).resolve().parents[2]
WORKERS = 2
WORKER_CPUS = 1
RESOURCE = "rollout_worker"


@dataclass(frozen=True)
class RayCluster:
    address: str  # the GCS, what `ray.init(address=...)` and `--ray` take
    token: str
    head: str  # the head's node id: the drivers' node
    workers: list[str]  # the worker nodes' ids
    pid: int

    def environment(self) -> dict[str, str]:
        """What a driver process needs: the token, this tree first on the path, and Ray told
        the cluster is on the loopback interface."""
        path = os.pathsep.join([str(REPO), str(REPO / "loader"), os.environ.get("PYTHONPATH", "")])
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        return env | {
            "PYTHONPATH": path.rstrip(os.pathsep),
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.token,
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_USAGE_STATS_ENABLED": "0",
        }


def free_port() -> int:
    """A port nothing listens on (until something takes it)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start(state: Path, timeout: float, object_store_bytes: int | None = None) -> RayCluster:
    """The cluster, up with its three nodes, or an AssertionError with its output; each
    worker node's object store of `object_store_bytes` (None: Ray's own choice for a
    `cluster_utils` node, a small store that spills a large step's pieces to disk)."""
    token = secrets.token_hex(32)
    probe = RayCluster("", token, "", [], 0)
    log = state.with_suffix(".log")
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, __file__, str(state), str(object_store_bytes or 0)],
            env=probe.environment(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout
    while not state.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process.pid)
            raise AssertionError(f"the Ray cluster did not start: {log.read_text()[-3000:]}")
        time.sleep(0.5)
    up = json.loads(state.read_text())
    return RayCluster(up["address"], token, up["head"], up["workers"], process.pid)


STATE_FILE = "ray-cluster.json"


@contextmanager
def shared(folder: Path, timeout: float) -> Iterator[RayCluster]:
    """The cluster of the test modules that run at the same time, on any pytest worker
    (`tests.support.shared`), its state kept in `folder`: the session's folder."""

    def begin() -> RayCluster:
        state = Path(tempfile.mkdtemp(prefix="cluster-", dir=folder)) / "cluster.json"
        return start(state, timeout)

    with shared_service(folder / STATE_FILE, RayCluster, begin, lambda up: stop(up.pid)) as up:
        yield up


def stop(pid: int) -> None:
    """Stop the cluster's process (it shuts its nodes down), killing its group after a grace."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:
            return
        time.sleep(0.2)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _serve(state: Path, object_store_bytes: int) -> None:
    import ray
    from ray.cluster_utils import Cluster

    loopback = "127.0.0.1"
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "node_ip_address": loopback, "include_dashboard": False},
    )
    for _ in range(WORKERS):
        store = {"object_store_memory": object_store_bytes} if object_store_bytes else {}
        cluster.add_node(
            num_cpus=WORKER_CPUS,
            node_ip_address=loopback,
            resources={RESOURCE: WORKER_CPUS},
            **store,
        )
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, _node_ip_address=loopback)
    nodes = [node for node in ray.nodes() if node["Alive"]]
    head = [n["NodeID"] for n in nodes if "node:__internal_head__" in n["Resources"]]
    workers = [n["NodeID"] for n in nodes if RESOURCE in n["Resources"]]
    ray.shutdown()
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    partial = state.with_suffix(".partial")
    partial.write_text(
        json.dumps({"address": cluster.address, "head": head[0], "workers": workers})
    )
    partial.rename(state)
    while not stopping:
        time.sleep(0.2)
    cluster.shutdown()


if __name__ == "__main__":
    _serve(Path(sys.argv[1]), int(sys.argv[2]))


def run_driver(cluster: RayCluster, driver: Path, spec: dict[str, Any], timeout: float) -> Any:
    """Run `driver` (a script joining `cluster`, given `spec` as JSON) in a process of its
    own; what it printed last, as JSON."""
    result = subprocess.run(
        [sys.executable, str(driver), json.dumps(spec)],
        env=cluster.environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_python(
    args: list[str], env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """`python ARGS` in a process of its own with the environment `env`."""
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def run_cli(
    cluster: RayCluster, args: list[str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """`rollout-shards ARGS` in a process of its own with the cluster's environment."""
    return run_python(["-m", "pipeline.cli", *args], cluster.environment(), timeout)

"""A one-node Ray head on 127.0.0.1 for the tests: started once for the test modules that run
at the same time, on any pytest worker, and stopped by the last of them (`tests.support.shared`).

A head takes tens of seconds to start on an idle 2-core
machine and several times that on a busy one: the waits scale with the load average per
core, and a start that fails or stalls is retried on fresh ports.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import requests
from ray.job_submission import JobSubmissionClient

from tests.support.shared import alive, shared

# What a start may take on an idle machine, before scaling by the load.
BASE_START_S = 120.0
MAX_LOAD_SCALE = 4.0
START_ATTEMPTS = 3
# The head's own shutdown takes half a minute; nothing of it is needed after the tests.
STOP_GRACE_S = 5.0
STATE_FILE = "ray-head.json"


class HeadStartError(Exception):
    """The head did not come up; the message holds the end of its log."""


@dataclass(frozen=True)
class RayHead:
    url: str  # the dashboard, http://127.0.0.1:PORT
    token: str | None  # Ray's token, when the dashboard asks for one
    pid: int  # `ray start --block`, the leader of the head's process group
    temp: str  # the head's --temp-dir
    address: str  # the GCS, 127.0.0.1:PORT: what a driver's `ray.init(address=...)` takes

    def environment(self) -> dict[str, str]:
        """What a client (ours, Ray's own, a `dagster job execute` run) needs to be let in."""
        if self.token is None:
            return {}
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token}

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token is not None else {}


def start_timeout() -> float:
    """Seconds a start may take now: the base, times the load average per core (1 to 4)."""
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    return BASE_START_S * min(max(load, 1.0), MAX_LOAD_SCALE)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _command(temp: Path, dashboard_port: int, gcs_port: int) -> list[str]:
    return [
        str(Path(sys.executable).with_name("ray")),
        *("start", "--head", "--block", "--disable-usage-stats", "--num-cpus=1"),
        "--node-ip-address=127.0.0.1",
        f"--port={gcs_port}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard_port}",
        "--include-dashboard=true",
        f"--temp-dir={temp}",
        # Ray's agents listen on fixed default ports: free ones let two heads (two test
        # sessions on one machine) start side by side.
        *(
            f"--{name}={_free_port()}"
            for name in (
                "dashboard-agent-listen-port",
                "dashboard-agent-grpc-port",
                "metrics-export-port",
                "runtime-env-agent-port",
                "ray-client-server-port",
            )
        ),
    ]


def _wait_for_dashboard(head: RayHead, process: subprocess.Popen[bytes], deadline: float) -> None:
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise HeadStartError(f"ray head exited {process.returncode}: {_log_tail(head)}")
        request = urllib.request.Request(f"{head.url}/api/version", headers=head.headers())
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                json.load(response)
            return
        except OSError:
            time.sleep(1)
    raise HeadStartError(f"ray dashboard did not answer in time: {_log_tail(head)}")


def _wait_for_job_agent(head: RayHead, deadline: float) -> None:
    """The dashboard answers before its job agent does ("No available agent to submit
    job", or a dropped connection while the agent starts): submit a no-op job until one is
    taken, and let it finish."""
    client = JobSubmissionClient(head.url, headers=head.headers())
    while time.monotonic() < deadline:
        try:
            job = client.submit_job(entrypoint="true", submission_id=f"warm-up-{time.time_ns()}")
        except (RuntimeError, requests.RequestException):
            time.sleep(1)
            continue
        while not client.get_job_status(job).is_terminal():
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        else:
            return
    raise HeadStartError(f"ray job agent did not start in time: {_log_tail(head)}")


def _log_tail(head: RayHead) -> str:
    log = Path(head.temp) / "head.log"
    return log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"


def _start_once(timeout: float, auth: bool) -> RayHead:
    # Ray puts sockets under its temp dir, and their paths must stay short.
    temp = Path(tempfile.mkdtemp(prefix="rs-ray-", dir="/tmp"))
    dashboard_port, gcs_port = _free_port(), _free_port()
    token = secrets.token_hex(32) if auth else None
    # Ray turns 127.0.0.1 into the machine's address unless it is told the cluster is one
    # machine; this keeps every Ray process on the loopback interface.
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(name, None)
    env["RAY_AUTH_MODE"] = "token" if token is not None else "disabled"
    if token is not None:
        env["RAY_AUTH_TOKEN"] = token
    with (temp / "head.log").open("wb") as out:
        process = subprocess.Popen(
            _command(temp, dashboard_port, gcs_port),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    head = RayHead(
        f"http://127.0.0.1:{dashboard_port}",
        token,
        process.pid,
        str(temp),
        f"127.0.0.1:{gcs_port}",
    )
    deadline = time.monotonic() + timeout
    try:
        _wait_for_dashboard(head, process, deadline)
        _wait_for_job_agent(head, deadline)
    except BaseException:
        stop(head)
        raise
    return head


def start(auth: bool = False) -> RayHead:
    """A head whose job agent takes jobs; up to three starts, each with fresh ports and a
    wait that scales with the load at that moment."""
    failures = []
    for attempt in range(1, START_ATTEMPTS + 1):
        timeout = start_timeout()
        try:
            return _start_once(timeout, auth)
        except HeadStartError as error:
            failures.append(f"start {attempt} ({timeout:.0f}s allowed): {error}")
    raise HeadStartError("\n".join(failures))


def stop(head: RayHead) -> None:
    """Stop the head through its process group: SIGTERM, then SIGKILL after a grace."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(head.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + STOP_GRACE_S
        while alive(head.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not alive(head.pid):
            break
    try:  # reap it when this process started it
        os.waitpid(head.pid, os.WNOHANG)
    except ChildProcessError:
        pass
    shutil.rmtree(head.temp, ignore_errors=True)


@contextmanager
def shared_head(folder: Path, auth: bool = False) -> Iterator[RayHead]:
    """The head of the session whose workers share `folder` (`tests.support.shared`)."""
    with shared(folder / STATE_FILE, RayHead, lambda: start(auth), stop) as head:
        yield head

"""A stand-in for the Kubernetes API server, enough for `dagster_k8s.PipesK8sClient`.

This machine has no cluster and cannot pull images, so the stand-in answers the five calls
the client makes (create pod, list pods by name, read its log, delete it, read it) over
HTTP on 127.0.0.1, and "runs" a pod by starting its first container's command here, with
the pod's environment and the repository as working directory, as an image with
rollout-shards installed would. Everything on the Dagster side is the real client: the
kubeconfig loading, the pod body, the Pipes context in the pod's environment, the Pipes
messages read back from the pod's log, the wait for termination and the pod's deletion.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

REPO = Path(__file__).resolve().parents[2]
KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{{name: stand-in, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
users: [{{name: stand-in, user: {{token: stand-in}}}}]
contexts: [{{name: stand-in, context: {{cluster: stand-in, user: stand-in}}}}]
current-context: stand-in
"""


@dataclass
class Pod:
    namespace: str
    body: dict[str, Any]
    process: subprocess.Popen[bytes]
    log: bytes = b""
    deleted: bool = False
    reader: threading.Thread = field(init=False)
    started: float = field(init=False)
    ended: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.started = time.monotonic()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        # One timestamp per line, each later than the last, as the kubelet writes them:
        # the client splits the stream into messages by timestamp.
        start = datetime.now(UTC).replace(tzinfo=None)
        assert self.process.stdout is not None
        lines = []
        for number, line in enumerate(self.process.stdout):
            stamp = (start + timedelta(microseconds=number)).isoformat(timespec="microseconds")
            lines.append(f"{stamp}Z ".encode() + line)
        self.process.wait()
        self.ended = time.monotonic()
        self.log = b"".join(lines)

    @property
    def container(self) -> dict[str, Any]:
        return self.body["spec"]["containers"][0]

    def status(self) -> dict[str, Any]:
        code = self.process.poll()
        state = {"running": {}} if code is None else {"terminated": {"exitCode": code}}
        return {
            "phase": "Running" if code is None else ("Succeeded" if code == 0 else "Failed"),
            "containerStatuses": [
                {
                    "name": self.container["name"],
                    "image": self.container["image"],
                    "imageID": "",
                    "ready": code is None,
                    "restartCount": 0,
                    "state": state,
                }
            ],
        }

    def finished_log(self) -> bytes:
        self.reader.join()
        return self.log


class KubeStandIn:
    """The API server; `pods` holds every pod created, by name, deleted ones included."""

    def __init__(self, folder: Path) -> None:
        self.pods: dict[str, Pod] = {}
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.kubeconfig = folder / "kubeconfig"
        self.kubeconfig.write_text(KUBECONFIG.format(port=self.server.server_address[1]))

    def create(self, namespace: str, body: dict[str, Any]) -> Pod:
        container = body["spec"]["containers"][0]
        env = {item["name"]: item["value"] for item in container.get("env") or []}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
        process = subprocess.Popen(
            container["command"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        pod = Pod(namespace, body, process)
        self.pods[body["metadata"]["name"]] = pod
        return pod

    def live(self, namespace: str, name: str) -> Pod | None:
        pod = self.pods.get(name)
        return pod if pod is not None and pod.namespace == namespace and not pod.deleted else None


def _handler(cluster: KubeStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, payload: bytes, kind: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _json(self, value: Any, status: int = 200) -> None:
            self._send(status, json.dumps(value).encode())

        def _not_found(self, name: str) -> None:
            self._json(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "code": 404,
                    "reason": "NotFound",
                    "message": f'pods "{name}" not found',
                },
                404,
            )

        def _pod_json(self, pod: Pod) -> dict[str, Any]:
            return {"apiVersion": "v1", "kind": "Pod", **pod.body, "status": pod.status()}

        def _route(self) -> tuple[str, str | None, str | None, dict[str, list[str]]]:
            url = urlparse(self.path)
            parts = url.path.strip("/").split("/")
            # api / v1 / namespaces / <ns> / pods [/ <name> [/ log]]
            namespace = parts[3]
            name = parts[5] if len(parts) > 5 else None
            sub = parts[6] if len(parts) > 6 else None
            return namespace, name, sub, parse_qs(url.query)

        def do_POST(self) -> None:
            namespace, _, _, _ = self._route()
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self._json(self._pod_json(cluster.create(namespace, body)), 201)

        def do_GET(self) -> None:
            namespace, name, sub, query = self._route()
            if name is None:
                wanted = query["fieldSelector"][0].removeprefix("metadata.name=")
                pod = cluster.live(namespace, wanted)
                items = [] if pod is None else [self._pod_json(pod)]
                self._json({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})
                return
            pod = cluster.live(namespace, name)
            if pod is None:
                self._not_found(name)
            elif sub == "log":
                log = pod.finished_log()
                if "tailLines" in query:
                    log = b"".join(log.splitlines(keepends=True)[-int(query["tailLines"][0]) :])
                self._send(200, log, "text/plain")
            else:
                self._json(self._pod_json(pod))

        def do_DELETE(self) -> None:
            namespace, name, _, _ = self._route()
            pod = cluster.live(namespace, name or "")
            if pod is None:
                self._not_found(name or "")
                return
            pod.process.wait()
            pod.deleted = True
            self._json(self._pod_json(pod))

    return Handler


@contextmanager
def kube_stand_in(folder: Path) -> Iterator[KubeStandIn]:
    cluster = KubeStandIn(folder)
    thread = threading.Thread(target=cluster.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield cluster
    finally:
        cluster.server.shutdown()
        cluster.server.server_close()
        for pod in cluster.pods.values():
            if pod.process.poll() is None:
                pod.process.kill()
            pod.process.wait()

"""The Ray Jobs REST client against a stand-in HTTP server: the requests it makes, the
headers it sends (Ray's token, extra ones), a CA bundle for https, and the one-line errors
of answers a Ray dashboard would not give (the real head's answers, a token-auth one too,
are covered by test_compute_ray.py)."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from pipeline.errors import UsageError
from pipeline.orchestration.ray_jobs import RayJobs, RayJobsError, WarmQueue, request_headers

# path -> (status, body) the stand-in answers; requests it got, as (method, path, body),
# and the headers of each.
ANSWERS: dict[str, tuple[int, str]] = {}
REQUESTS: list[tuple[str, str, Any]] = []
HEADERS: list[dict[str, str]] = []
AUTH_ENVS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


class _Handler(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        REQUESTS.append((self.command, self.path, body))
        HEADERS.append({name.lower(): value for name, value in self.headers.items()})
        status, text = ANSWERS.get(self.path, (404, "no such page"))
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(autouse=True)
def no_ray_auth(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No Ray token anywhere unless a test puts one: a home without ~/.ray; returns it."""
    for name in AUTH_ENVS:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


@contextmanager
def _serving(tls: ssl.SSLContext | None = None) -> Iterator[str]:
    ANSWERS.clear()
    REQUESTS.clear()
    HEADERS.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        scheme = "https" if tls is not None else "http"
        yield f"{scheme}://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def dashboard() -> Iterator[str]:
    with _serving() as url:
        yield url


def _error(call: Callable[[], object]) -> str:
    """The one line of the RayJobsError that `call` raises."""
    with pytest.raises(RayJobsError) as raised:
        call()
    assert "\n" not in str(raised.value)
    return str(raised.value)


def test_the_four_calls_of_a_job(dashboard: str) -> None:
    ANSWERS["/api/jobs/"] = (200, json.dumps({"job_id": "s-1", "submission_id": "s-1"}))
    ANSWERS["/api/jobs/s-1"] = (200, json.dumps({"status": "RUNNING", "message": None}))
    ANSWERS["/api/jobs/s-1/logs"] = (200, json.dumps({"logs": "line one\nline two\n"}))
    ANSWERS["/api/jobs/s-1/stop"] = (200, json.dumps({"stopped": False}))
    jobs = RayJobs(dashboard)

    assert jobs.submit({"entrypoint": "python -m w", "submission_id": "s-1"}) == "s-1"
    state = jobs.state("s-1")
    assert (state.status, state.message, state.terminal) == ("RUNNING", "", False)
    assert jobs.logs("s-1") == "line one\nline two\n"
    assert jobs.stop("s-1") is False
    assert REQUESTS == [
        ("POST", "/api/jobs/", {"entrypoint": "python -m w", "submission_id": "s-1"}),
        ("GET", "/api/jobs/s-1", None),
        ("GET", "/api/jobs/s-1/logs", None),
        ("POST", "/api/jobs/s-1/stop", None),
    ]


def test_a_refusal_is_one_line_with_rays_message(dashboard: str) -> None:
    traceback = (
        "Traceback (most recent call last):\n  File 'job_head.py', line 419\n"
        "ValueError: Job with submission_id s-1 already exists.\n"
    )
    ANSWERS["/api/jobs/"] = (500, traceback)
    jobs = RayJobs(dashboard)

    assert _error(lambda: jobs.submit({"entrypoint": "true", "submission_id": "s-1"})) == (
        f"the Ray dashboard at {dashboard} refused POST /api/jobs/: HTTP 500 "
        "ValueError: Job with submission_id s-1 already exists."
    )
    assert _error(lambda: jobs.state("gone")).endswith(
        "refused GET /api/jobs/gone: HTTP 404 no such page"
    )


def test_a_server_that_is_not_a_ray_dashboard_is_one_line(dashboard: str) -> None:
    ANSWERS["/api/jobs/"] = (200, json.dumps({"hello": "world"}))
    ANSWERS["/api/jobs/s-1"] = (200, "<html>a login page</html>")
    jobs = RayJobs(dashboard)

    assert _error(lambda: jobs.submit({"entrypoint": "true"})) == (
        f"the Ray dashboard at {dashboard} answered POST /api/jobs/ without 'submission_id': "
        '{"hello": "world"}'
    )
    assert "answered GET /api/jobs/s-1 with no JSON (Expecting" in _error(lambda: jobs.state("s-1"))


def test_ids_are_quoted_into_the_path(dashboard: str) -> None:
    ANSWERS["/api/jobs/a%2Fb%20c"] = (200, json.dumps({"status": "SUCCEEDED"}))

    assert RayJobs(dashboard).state("a/b c").terminal
    assert REQUESTS == [("GET", "/api/jobs/a%2Fb%20c", None)]


def _token_sent(dashboard: str, extra: dict[str, str] | None = None) -> str | None:
    """The Authorization header of one call, as the stand-in got it."""
    ANSWERS["/api/jobs/s-1"] = (200, json.dumps({"status": "RUNNING"}))
    RayJobs(dashboard, headers=extra).state("s-1")
    return HEADERS[-1].get("authorization")


def test_rays_token_is_sent_from_where_ray_looks(
    dashboard: str, monkeypatch: pytest.MonkeyPatch, no_ray_auth: Path, tmp_path: Path
) -> None:
    (no_ray_auth / ".ray").mkdir()
    (no_ray_auth / ".ray" / "auth_token").write_text("from-home\n")
    named = tmp_path / "named-token"
    named.write_text("  from-path  \n")
    # As Ray's client: nothing unless RAY_AUTH_MODE is token, though a token is there.
    assert _token_sent(dashboard) is None
    monkeypatch.setenv("RAY_AUTH_MODE", "TOKEN")
    assert _token_sent(dashboard) == "Bearer from-home"
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(named))
    assert _token_sent(dashboard) == "Bearer from-path"
    monkeypatch.setenv("RAY_AUTH_TOKEN", "from-env")
    assert _token_sent(dashboard) == "Bearer from-env"
    # An Authorization of the extra headers (a proxy's) is sent instead of Ray's token.
    extra = {"authorization": "Basic cHJveHk6cHc=", "X-Tenant": "rl"}
    assert _token_sent(dashboard, extra) == "Basic cHJveHk6cHc="
    assert HEADERS[-1]["x-tenant"] == "rl"


def test_a_missing_token_is_one_line_naming_where_ray_looks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    with pytest.raises(UsageError) as raised:
        request_headers()
    assert str(raised.value) == (
        "compute ray: $RAY_AUTH_MODE is token but there is no token: set $RAY_AUTH_TOKEN, "
        "the file $RAY_AUTH_TOKEN_PATH names, or ~/.ray/auth_token"
    )
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "gone"))
    with pytest.raises(UsageError, match=r"RAY_AUTH_TOKEN_PATH names .*gone, which holds no token"):
        request_headers()


def test_a_refusal_for_want_of_the_token_says_how_to_send_it(
    dashboard: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a token-auth head answers (Ray's http_token_authentication middleware).
    ANSWERS["/api/jobs/s-1"] = (401, "Unauthorized: Missing authentication token")

    assert _error(lambda: RayJobs(dashboard).state("s-1")) == (
        f"the Ray dashboard at {dashboard} refused GET /api/jobs/s-1: HTTP 401 Unauthorized: "
        "Missing authentication token (the head asks for Ray's token: set RAY_AUTH_MODE=token "
        "and $RAY_AUTH_TOKEN, the file $RAY_AUTH_TOKEN_PATH names, or ~/.ray/auth_token)"
    )
    ANSWERS["/api/jobs/s-1"] = (403, "Forbidden: Invalid authentication token")
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "wrong")
    assert _error(lambda: RayJobs(dashboard).state("s-1")).endswith(
        "HTTP 403 Forbidden: Invalid authentication token (the token sent is not the head's: "
        "check $RAY_AUTH_TOKEN, the file $RAY_AUTH_TOKEN_PATH names, or ~/.ray/auth_token)"
    )


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key."""
    openssl = shutil.which("openssl")
    assert openssl, "openssl makes the test's certificate"
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *(openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_an_https_dashboard_is_trusted_through_the_ca_bundle(
    certificate: tuple[Path, Path], tmp_path: Path
) -> None:
    cert, key = certificate
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    with _serving(tls) as url:
        ANSWERS["/api/jobs/s-1"] = (200, json.dumps({"status": "SUCCEEDED"}))

        assert RayJobs(url, ca_bundle=str(cert)).state("s-1").terminal
        # Without it the system's certificates do not know the dashboard's.
        assert "CERTIFICATE_VERIFY_FAILED" in _error(lambda: RayJobs(url).state("s-1"))
    with pytest.raises(UsageError, match=r"ray.ca_bundle .*absent.pem does not exist"):
        RayJobs("https://head:8265", ca_bundle=str(tmp_path / "absent.pem"))


def test_a_warm_queue_hands_each_step_to_one_job(tmp_path: Path) -> None:
    queue = WarmQueue(tmp_path / "pool")
    queue.create()
    queue.enqueue("a", {"DAGSTER_PIPES_CONTEXT": "ctx-a"})
    queue.enqueue("b", {"DAGSTER_PIPES_CONTEXT": "ctx-b"})
    assert queue.waiting() == 2 and queue.taker("a") is None

    assert queue.claim("job1") == ("a", {"DAGSTER_PIPES_CONTEXT": "ctx-a"})
    assert queue.claim("job2") == ("b", {"DAGSTER_PIPES_CONTEXT": "ctx-b"})
    assert queue.claim("job3") is None
    assert (queue.taker("a"), queue.taker("b")) == ("job1", "job2")
    assert queue.busy({"job1"}) == 1 and queue.busy({"job1", "job2"}) == 2
    # A step already taken cannot be withdrawn; its job stays known once it is done.
    assert not queue.withdraw("a")
    queue.done("a", "job1")
    assert queue.taker("a") == "job1" and queue.busy({"job1"}) == 0
    queue.forget("a")
    assert queue.taker("a") is None
    queue.enqueue("c", {})
    assert queue.withdraw("c") and queue.claim("job1") is None
    with queue.started_jobs() as started:
        started.append("job1")
    with queue.started_jobs() as started:
        assert started == ["job1"]

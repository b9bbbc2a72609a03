"""The Ray Jobs REST client against a stand-in HTTP server: the requests it makes and the
one-line errors of answers a Ray dashboard would not give (the real head's answers are
covered by test_compute_ray.py)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from pipeline.orchestration.ray_jobs import RayJobs, RayJobsError

# path -> (status, body) the stand-in answers; requests it got, as (method, path, body).
ANSWERS: dict[str, tuple[int, str]] = {}
REQUESTS: list[tuple[str, str, Any]] = []


class _Handler(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        REQUESTS.append((self.command, self.path, body))
        status, text = ANSWERS.get(self.path, (404, "no such page"))
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def dashboard() -> Iterator[str]:
    ANSWERS.clear()
    REQUESTS.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


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

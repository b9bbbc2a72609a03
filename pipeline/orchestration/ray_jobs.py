"""The Ray Jobs REST API of a Ray head's dashboard, for `compute: ray`.

Ray documents these calls (docs.ray.io, "Ray Jobs REST API"); its own
`ray.job_submission.JobSubmissionClient` wraps them. Making them with the standard library
keeps Ray out of the Dagster process: importing `ray.job_submission` and making a client
(and dagster-ray) would cost every run of a backfill and every step of the Ray backend
their import time (docs/backends.md).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from pipeline.errors import UsageError

# Where Ray's own tools look for the dashboard when no address is given.
ADDRESS_ENVS = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
SUCCEEDED = "SUCCEEDED"
TERMINAL = frozenset({SUCCEEDED, "FAILED", "STOPPED"})
REQUEST_TIMEOUT_S = 30.0


class RayJobsError(Exception):
    """A call to the dashboard failed; the message is one line naming the call."""


def dashboard_url(address: str | None) -> str:
    """The dashboard's base URL: `address`, else $RAY_API_SERVER_ADDRESS or $RAY_ADDRESS."""
    value = address or next((os.environ[name] for name in ADDRESS_ENVS if os.environ.get(name)), "")
    if not value:
        raise UsageError(
            "compute ray needs the Ray dashboard's address: ray.address "
            "(http://head:8265) or $RAY_ADDRESS"
        )
    if not value.startswith(("http://", "https://")):
        raise UsageError(
            f"compute ray: the Ray address {value!r} is not the dashboard's URL "
            "(http://head:8265, the address `ray job submit` takes)"
        )
    return value.rstrip("/")


@dataclass(frozen=True)
class JobState:
    status: str  # PENDING, RUNNING, SUCCEEDED, FAILED or STOPPED
    message: str

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


class RayJobs:
    """Submit, watch, read and stop the jobs of one Ray cluster through its dashboard."""

    def __init__(self, url: str, timeout: float = REQUEST_TIMEOUT_S) -> None:
        self.url = url
        self.timeout = timeout

    def submit(self, params: dict[str, Any]) -> str:
        """Submit a job (`entrypoint`, `submission_id`, `runtime_env`, `metadata`,
        `entrypoint_num_cpus`, ...); returns its submission id."""
        path = "/api/jobs/"
        answer = self._call("POST", path, params)
        return str(self._field(answer, "submission_id", f"POST {path}"))

    def state(self, submission_id: str) -> JobState:
        path = f"/api/jobs/{_quoted(submission_id)}"
        answer = self._call("GET", path)
        status = self._field(answer, "status", f"GET {path}")
        return JobState(status=str(status), message=str(answer.get("message") or ""))

    def logs(self, submission_id: str) -> str:
        """Everything the job's entrypoint has written so far."""
        path = f"/api/jobs/{_quoted(submission_id)}/logs"
        return str(self._field(self._call("GET", path), "logs", f"GET {path}"))

    def stop(self, submission_id: str) -> bool:
        """Ask Ray to stop the job; False when it had already ended."""
        path = f"/api/jobs/{_quoted(submission_id)}/stop"
        return bool(self._field(self._call("POST", path), "stopped", f"POST {path}"))

    def _field(self, answer: Any, name: str, what: str) -> Any:
        """A field of an answer, which must be a JSON object holding it (a server that is
        not a Ray dashboard answers something else)."""
        if not isinstance(answer, dict) or answer.get(name) is None:
            raise RayJobsError(
                f"the Ray dashboard at {self.url} answered {what} without {name!r}: "
                f"{json.dumps(answer)[:200]}"
            )
        return answer[name]

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        what = f"{method} {path}"
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:
            # The body is Ray's message, or a traceback whose last line is the message.
            lines = error.read().decode(errors="replace").strip().splitlines()
            detail = lines[-1].strip() if lines else str(error.reason)
            raise RayJobsError(
                f"the Ray dashboard at {self.url} refused {what}: HTTP {error.code} {detail}"
            ) from None
        except OSError as error:  # URLError, timeouts, resets
            reason = getattr(error, "reason", error)
            raise RayJobsError(
                f"the Ray dashboard at {self.url} did not answer {what}: {reason}"
            ) from None
        except ValueError as error:  # not JSON: a server that is not a Ray dashboard
            raise RayJobsError(
                f"the Ray dashboard at {self.url} answered {what} with no JSON ({error})"
            ) from None


def _quoted(submission_id: str) -> str:
    return urllib.parse.quote(submission_id, safe="")

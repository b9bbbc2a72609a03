"""The Ray Jobs REST API of a Ray head's dashboard, for `compute: ray`.

Ray documents these calls (docs.ray.io, "Ray Jobs REST API"); its own
`ray.job_submission.JobSubmissionClient` wraps them. Making them with the standard library
keeps Ray out of the Dagster process (Ray's imports and client cost CPU on every run of a
backfill, docs/backends.md).

A head started with `RAY_AUTH_MODE=token` answers 401 to a request without Ray's token.
The token is found and sent as Ray's client does it (Ray 2.60, `AuthenticationTokenLoader`
and `get_auth_headers_if_auth_enabled`): only when `RAY_AUTH_MODE` is `token` here too;
then from `RAY_AUTH_TOKEN`, else the file `RAY_AUTH_TOKEN_PATH` names, else
`~/.ray/auth_token`, stripped; sent as `Authorization: Bearer <token>` unless the extra
headers carry an Authorization of their own.
"""

from __future__ import annotations

import fcntl
import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import UsageError

# Where Ray's own tools look for the dashboard when no address is given.
ADDRESS_ENVS = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
SUCCEEDED = "SUCCEEDED"
TERMINAL = frozenset({SUCCEEDED, "FAILED", "STOPPED"})
REQUEST_TIMEOUT_S = 30.0
AUTH_MODE_ENV = "RAY_AUTH_MODE"
TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
DEFAULT_TOKEN_FILE = Path(".ray") / "auth_token"  # under the home folder
TOKEN_SOURCES = f"${TOKEN_ENV}, the file ${TOKEN_PATH_ENV} names, or ~/{DEFAULT_TOKEN_FILE}"


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


def ray_token() -> str | None:
    """Ray's token, looked up as Ray's own client does; None unless $RAY_AUTH_MODE is token."""
    if os.environ.get(AUTH_MODE_ENV, "").strip().lower() != "token":
        return None
    token = os.environ.get(TOKEN_ENV, "").strip()
    if token:
        return token
    named = os.environ.get(TOKEN_PATH_ENV)
    path = Path(named) if named else Path.home() / DEFAULT_TOKEN_FILE
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = ""
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"compute ray: cannot read Ray's token from {path}: {error}") from None
    if token:
        return token
    if named:
        raise UsageError(f"compute ray: ${TOKEN_PATH_ENV} names {path}, which holds no token")
    raise UsageError(
        f"compute ray: ${AUTH_MODE_ENV} is token but there is no token: set {TOKEN_SOURCES}"
    )


def request_headers(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The headers of every call: JSON, Ray's token if the mode asks for it, then `extra`
    (which may carry its own Authorization, as with a proxy in front of the head)."""
    headers = {"Content-Type": "application/json"}
    extra = extra or {}
    token = None if _has_authorization(extra) else ray_token()
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return {**headers, **extra}


def _has_authorization(headers: dict[str, str]) -> bool:
    return any(name.lower() == "authorization" for name in headers)


def tls_context(ca_bundle: str | None) -> ssl.SSLContext | None:
    """Certificates to trust for an https dashboard: a PEM file or a folder of them (None:
    the system's)."""
    if ca_bundle is None:
        return None
    path = Path(ca_bundle)
    if path.is_dir():
        return ssl.create_default_context(capath=str(path))
    if path.is_file():
        try:
            return ssl.create_default_context(cafile=str(path))
        except ssl.SSLError as error:
            raise UsageError(
                f"compute ray: ray.ca_bundle {path} holds no certificate: {error}"
            ) from None
    raise UsageError(f"compute ray: ray.ca_bundle {path} does not exist")


def _refusal_hint(code: int, sent_token: bool) -> str:
    """What to do about a refusal for want of Ray's token (401) or for a wrong one (403)."""
    if code == 401 and not sent_token:
        return f" (the head asks for Ray's token: set {AUTH_MODE_ENV}=token and {TOKEN_SOURCES})"
    if code == 403 and sent_token:
        return f" (the token sent is not the head's: check {TOKEN_SOURCES})"
    return ""


@dataclass(frozen=True)
class JobState:
    status: str  # PENDING, RUNNING, SUCCEEDED, FAILED or STOPPED
    message: str

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


class RayJobs:
    """Submit, watch, read and stop the jobs of one Ray cluster through its dashboard."""

    def __init__(
        self,
        url: str,
        timeout: float = REQUEST_TIMEOUT_S,
        headers: dict[str, str] | None = None,
        ca_bundle: str | None = None,
    ) -> None:
        self.url = url
        self.timeout = timeout
        self._headers = request_headers(headers)
        self._tls = tls_context(ca_bundle)

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
            self.url + path, data=data, method=method, headers=self._headers
        )
        what = f"{method} {path}"
        try:
            with urllib.request.urlopen(
                request, timeout=self.timeout, context=self._tls
            ) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:
            # The body is Ray's message, or a traceback whose last line is the message.
            lines = error.read().decode(errors="replace").strip().splitlines()
            detail = lines[-1].strip() if lines else str(error.reason)
            raise RayJobsError(
                f"the Ray dashboard at {self.url} refused {what}: HTTP {error.code} {detail}"
                + _refusal_hint(error.code, _has_authorization(self._headers))
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


class WarmQueue:
    """Steps waiting for a warm Ray job: one JSON file per step in a folder that the Dagster
    side and the Ray workers both see (under the output root, which both must mount).

    `queue/<request>.json` holds the Pipes bootstrap variables of one step's session; a warm
    job claims it by renaming it to `taken/<request>.<job id>.json` (a rename is atomic, so
    two jobs never take the same step) and moves it to `done/` when the step is done, where
    the Dagster side, which may see the step only then, reads the job and removes it. The
    step's Pipes messages go to `messages/<request>.jsonl`. `jobs.json`, under `jobs.lock`, lists
    the warm jobs the Dagster side has started.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.queue = folder / "queue"
        self.taken = folder / "taken"
        self.done_ = folder / "done"
        self.messages = folder / "messages"

    def create(self) -> None:
        for path in (self.queue, self.taken, self.done_, self.messages):
            path.mkdir(parents=True, exist_ok=True)

    def enqueue(self, request: str, env: dict[str, str]) -> None:
        partial = self.queue / f".{request}.partial"
        partial.write_text(json.dumps(env))
        partial.rename(self.queue / f"{request}.json")

    def withdraw(self, request: str) -> bool:
        """Take a step out of the queue; False if a job has taken it already."""
        try:
            (self.queue / f"{request}.json").unlink()
        except FileNotFoundError:
            return False
        return True

    def taker(self, request: str) -> str | None:
        """The job that has taken the step (or built it), if one has."""
        for folder in (self.taken, self.done_):
            found = next(folder.glob(f"{request}.*.json"), None)
            if found is not None:
                return found.name.split(".")[1]
        return None

    def claim(self, job: str) -> tuple[str, dict[str, str]] | None:
        """The oldest waiting step, taken for `job`: its request id and bootstrap variables."""
        waiting = sorted(self.queue.glob("*.json"), key=_modified)
        for path in waiting:
            request = path.stem
            taken = self.taken / f"{request}.{job}.json"
            try:
                path.rename(taken)
            except FileNotFoundError:  # another job took it, or its run withdrew it
                continue
            return request, json.loads(taken.read_text())
        return None

    def done(self, request: str, job: str) -> None:
        name = f"{request}.{job}.json"
        (self.taken / name).rename(self.done_ / name)

    def forget(self, request: str) -> None:
        """Remove what is left of a step that Dagster has finished with."""
        for folder in (self.queue, self.taken, self.done_):
            for path in folder.glob(f"{request}*.json"):
                path.unlink(missing_ok=True)

    def waiting(self) -> int:
        return sum(1 for _ in self.queue.glob("*.json"))

    def busy(self, jobs: set[str]) -> int:
        """How many of `jobs` are building a step now."""
        return sum(1 for path in self.taken.glob("*.json") if path.name.split(".")[1] in jobs)

    def message_file(self, request: str) -> Path:
        return self.messages / f"{request}.jsonl"

    @contextmanager
    def started_jobs(self) -> Iterator[list[str]]:
        """The warm jobs started so far, under an exclusive lock; what the caller leaves in
        the list is written back."""
        with (self.folder / "jobs.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            listed = self.folder / "jobs.json"
            jobs = json.loads(listed.read_text()) if listed.exists() else []
            yield jobs
            partial = self.folder / ".jobs.json.partial"
            partial.write_text(json.dumps(jobs))
            partial.rename(listed)


def _modified(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return float("inf")

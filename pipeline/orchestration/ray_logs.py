"""A Pipes message reader for Ray jobs that is done as soon as the job is.

dagster-ray's reader (`PipesRayJobMessageReader`) follows the job's log over the
dashboard's websocket (`tail_job_logs`). Ray's tailer sleeps a second whenever it reaches
the end of the file (`JobManager.LOG_TAIL_SLEEP_S`) and ends the stream only after two
such reads around the job turning terminal, and the reader waits for that end, seconds
after the last message, on top of the tailer's own delay for each message. This reader
fetches the log by HTTP instead (`GET /api/jobs/<id>/logs`), about once a second while the
job runs (live logs) and once more when the session closes. The Ray session
(`compute.ray_job.ray_session`) closes it only after the job is terminal, and the job's output goes
straight to that file, so the last fetch holds every message.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg
from dagster._core.pipes.context import PipesLaunchedData
from dagster._core.pipes.utils import extract_message_or_forward_to_stdout
from dagster_pipes import PipesDefaultMessageWriter, PipesParams

from pipeline.orchestration.ray_jobs import RayJobs, RayJobsError

# The keys the Ray session reports at launch (as dagster-ray's client does).
RAY_ADDRESS_KEY = "ray_address"
RAY_JOB_ID_KEY = "ray_job_id"
LIVE_LOG_INTERVAL_S = 1.0

logger = logging.getLogger(__name__)


class RayJobLogReader(dg.PipesMessageReader):
    """Reads a Ray job's Pipes messages from its log, fetched whole, one session per reader."""

    def __init__(self, jobs: RayJobs, interval: float = LIVE_LOG_INTERVAL_S) -> None:
        self._interval = interval
        self._jobs = jobs
        self._job_id: str | None = None
        self._launched = threading.Event()
        self._closed = threading.Event()
        # Why the last read of the log, after the job ended, failed (the session reports it).
        self.unread: str | None = None

    def on_launched(self, launched_payload: PipesLaunchedData) -> None:
        self._job_id = launched_payload["extras"][RAY_JOB_ID_KEY]
        super().on_launched(launched_payload)
        self._launched.set()

    def messages_are_readable(self, params: PipesParams) -> bool:
        return self._launched.is_set()

    @contextmanager
    def read_messages(self, handler: dg.PipesMessageHandler) -> Iterator[PipesParams]:
        thread = threading.Thread(target=self._follow, args=(handler,), daemon=True)
        thread.start()
        try:
            yield {PipesDefaultMessageWriter.STDIO_KEY: PipesDefaultMessageWriter.STDOUT}
        finally:
            self._closed.set()
            thread.join()

    def no_messages_debug_text(self) -> str:
        return f"Read the log of Ray job {self._job_id}, which held no Pipes messages."

    def _follow(self, handler: dg.PipesMessageHandler) -> None:
        while not self._launched.is_set():
            if self._closed.wait(0.05):
                return
        handled = 0
        while True:
            # Read before fetching: once the session is closed the job is terminal and
            # the fetched log is complete.
            final = self._closed.is_set()
            try:
                handled = self._handle(handler, handled, final)
            except RayJobsError as error:
                if final:
                    self.unread = str(error)
                    return
                logger.warning("reading the log of Ray job %s failed: %s", self._job_id, error)
            if final:
                return
            self._closed.wait(self._interval)

    def _handle(self, handler: dg.PipesMessageHandler, handled: int, final: bool) -> int:
        """Handle the whole lines after the first `handled` characters (every line, the
        last one too, when `final`); returns how many characters are handled now."""
        assert self._job_id is not None
        text = self._jobs.logs(self._job_id)
        end = len(text) if final else text.rfind("\n") + 1
        for line in text[handled:end].splitlines():
            if line:
                extract_message_or_forward_to_stdout(handler, line)
        return max(handled, end)

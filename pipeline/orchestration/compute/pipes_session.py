"""What the Pipes backends share: the worker's module and the results a session hands on."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import dagster as dg

WORKER_MODULE = "pipeline.orchestration.pipes_worker"

# Dagster's own Pipes code calls a preview API and a deprecated one on every launch; the
# warnings are not about anything this project does.
warnings.filterwarnings(
    "ignore", message=r"Function `PipesMessageReader\.expected_writer_count`", category=Warning
)
warnings.filterwarnings(
    "ignore", message=r"AssetExecutionContext\.run_id is deprecated", category=DeprecationWarning
)


class Reported:
    """What a Pipes session has received from its worker, each materialization handed to
    Dagster once, with `metadata` added to each."""

    def __init__(
        self, session: dg.PipesSession, metadata: dict[str, dg.MetadataValue] | None = None
    ) -> None:
        self._session = session
        self._metadata = metadata
        self._handed = 0

    def new(self) -> Iterator[dg.MaterializeResult]:
        """The materializations received since the last call."""
        results = self._session.get_results(
            implicit_materializations=False, metadata=self._metadata
        )
        fresh, self._handed = results[self._handed :], len(results)
        yield from materializations(fresh)


def materializations(results: Any) -> Iterator[dg.MaterializeResult]:
    """The materializations among a session's results (its checks are not reported)."""
    for result in results:
        if isinstance(result, dg.MaterializeResult):
            yield result

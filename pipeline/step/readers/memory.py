"""The step read whole, in memory: every file read and typed (`io.load.load_step`), the
lists kept in the rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pipeline.io.discovery import SourceFile
from pipeline.io.load import load_step
from pipeline.settings import RowSettings, Settings
from pipeline.speed import EarlyDigests
from pipeline.step.check import ReadStep, check
from pipeline.step.tables import SampleTable, TrainBatch

if TYPE_CHECKING:
    from pipeline.step.build import StepJob


class MemoryReader:
    """The reader (`readers.Reader`) of a step held whole."""

    def read(self, job: StepJob) -> ReadStep:
        return ReadStep(load_step(job.step, job.sources, job.early))

    def planned(self, batch: TrainBatch) -> TrainBatch:
        return batch


def load_samples(
    step: int,
    sources: Sequence[SourceFile],
    settings: Settings | RowSettings,
    early: EarlyDigests | None = None,
) -> SampleTable:
    """A step read whole (`early`: digests of its files taken before the read) and checked."""
    return check(ReadStep(load_step(step, sources, early)), settings)

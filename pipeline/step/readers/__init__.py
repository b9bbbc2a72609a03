"""The readers of a step: each only reads, and hands `step.check.check` the step's typed rows
and where their per-token lists are (`check.ReadStep`).

- `memory`: the step whole, lists in its rows;
- `spill`: each file in parts, the lists spilled to a private folder of the output root;
- `shares`: shares of the files read by tasks next to the data (Ray, or this process),
  the lists left in the input files.

The driver (`step.build`) opens one reader per build (`Reader`), checks what it read, plans,
and asks the reader where the planned batch finds its lists (`planned`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pipeline.step.build import StepJob
    from pipeline.step.check import ReadStep
    from pipeline.step.tables import TrainBatch


class Reader(Protocol):
    """How a build reads its step (`read`) and where the planned batch finds its lists
    (`planned`)."""

    def read(self, job: StepJob) -> ReadStep: ...

    def planned(self, batch: TrainBatch) -> TrainBatch: ...

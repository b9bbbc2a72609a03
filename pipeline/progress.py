"""Progress of a CLI run: a bar per step and stage on stderr when it is a terminal.

stdout holds only what the README promises (one summary line per step, or a report), so a
file or a pipe gets exactly that; the progress is for a person watching, and says nothing
where no one is (stderr not a terminal) or with `--quiet`."""

from __future__ import annotations

import sys
import time
from typing import TextIO

BAR_WIDTH = 24
LINE_WIDTH = 100


class Progress:
    """Reports each stage of each step as one line redrawn in place on stderr, erased
    before anything else is printed; silent when stderr is not a terminal or when quiet."""

    def __init__(
        self,
        total_steps: int,
        stages: tuple[str, ...],
        stream: TextIO | None = None,
        quiet: bool = False,
    ) -> None:
        self.total_steps = total_steps
        self.stages = stages
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() and not quiet
        self.done_steps = 0
        self.started = time.perf_counter()

    def _bar(self, step: int, stage: str, detail: str = "") -> None:
        done = self.done_steps * len(self.stages) + self.stages.index(stage)
        total = self.total_steps * len(self.stages)
        filled = BAR_WIDTH * done // max(total, 1)
        bar = "#" * filled + "-" * (BAR_WIDTH - filled)
        line = f"[{bar}] step {step} ({self.done_steps + 1}/{self.total_steps}): {stage}{detail}"
        self.stream.write("\r" + line.ljust(72)[:LINE_WIDTH])
        self.stream.flush()

    def begin(self, step: int, stage: str) -> None:
        self.started = time.perf_counter()
        if self.tty:
            self._bar(step, stage)

    def end(self, step: int, stage: str, detail: str) -> None:
        if self.tty:
            seconds = time.perf_counter() - self.started
            self._bar(step, stage, f": {detail} ({seconds:.2f} s)")

    def step_done(self) -> None:
        self.done_steps += 1
        if self.tty:
            self.clear()

    def clear(self) -> None:
        """Erase the bar before another line is printed on the terminal."""
        if self.tty:
            self.stream.write("\r" + " " * LINE_WIDTH + "\r")
            self.stream.flush()

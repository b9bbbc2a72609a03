"""Progress of a CLI run: a bar per step and stage on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO

BAR_WIDTH = 24


class Progress:
    """Reports each stage of each step. On a terminal one line is redrawn in place on
    stderr; elsewhere (CI logs, pipes) every finished stage is one plain line on stdout."""

    def __init__(
        self,
        total_steps: int,
        stages: tuple[str, ...],
        stream: TextIO | None = None,
        quiet: bool = False,
    ) -> None:
        self.total_steps = total_steps
        self.stages = stages
        self.quiet = quiet
        self.tty = (stream or sys.stderr).isatty() and not quiet
        self.stream = (stream or sys.stderr) if self.tty else sys.stdout
        self.done_steps = 0
        self.started = time.perf_counter()

    def _bar(self, step: int, stage: str) -> None:
        done = self.done_steps * len(self.stages) + self.stages.index(stage)
        total = self.total_steps * len(self.stages)
        filled = BAR_WIDTH * done // max(total, 1)
        bar = "#" * filled + "-" * (BAR_WIDTH - filled)
        line = f"[{bar}] step {step} ({self.done_steps + 1}/{self.total_steps}): {stage}"
        self.stream.write("\r" + line.ljust(72)[:100])
        self.stream.flush()

    def begin(self, step: int, stage: str) -> None:
        self.started = time.perf_counter()
        if self.tty:
            self._bar(step, stage)

    def end(self, step: int, stage: str, detail: str) -> None:
        if not self.tty and not self.quiet:
            seconds = time.perf_counter() - self.started
            print(f"step {step}: {stage}: {detail} ({seconds:.2f} s)", file=self.stream, flush=True)

    def step_done(self) -> None:
        self.done_steps += 1
        if self.tty:
            self.clear()

    def clear(self) -> None:
        """Erase the bar before another line is printed on the terminal."""
        if self.tty:
            self.stream.write("\r" + " " * 100 + "\r")
            self.stream.flush()

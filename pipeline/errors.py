"""Errors a user can cause. The CLI and Dagster turn them into one readable line each."""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass, field

# Characters that would end a line, move the cursor or hide text on a terminal, or that are
# not text at all (a byte of a name that is not UTF-8, kept by Python as a lone surrogate).
_UNPRINTABLE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # os.fsdecode's stand-in for a byte that is not UTF-8
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` safe for one line of a terminal or a log: newlines, escape sequences and
    other control or direction characters, and the bytes of a name that is not UTF-8,
    shown as backslash escapes (a file name cannot split or forge a message line)."""
    return _UNPRINTABLE.sub(_escaped, text)


class UsageError(Exception):
    """Bad settings or arguments (exit status 2)."""


@dataclass
class Violation:
    """One broken rule in one step: what, where, and the first offending rows."""

    rule: str
    message: str
    step: int | None = None
    files: list[str] = field(default_factory=list)
    rows: list[tuple[int, int]] = field(default_factory=list)  # (index, leaf), first few
    n_rows: int = 0

    def line(self) -> str:
        parts = []
        if self.step is not None:
            parts.append(f"step {self.step}")
        if self.files:
            parts.append(", ".join(self.files))
        parts.append(f"rule {self.rule}: {self.message}")
        text = ": ".join(parts)
        if self.rows:
            shown = ", ".join(f"({i}, {leaf})" for i, leaf in self.rows)
            more = (
                f" and {self.n_rows - len(self.rows)} more" if self.n_rows > len(self.rows) else ""
            )
            text += f"; rows (index, leaf): {shown}{more}"
        return printable(text)


class StepError(Exception):
    """A step's data is invalid, or its settings cannot be satisfied (exit status 1)."""

    def __init__(self, violations: list[Violation]) -> None:
        self.violations = violations
        super().__init__("\n".join(v.line() for v in violations))


PROG = "rollout-shards"


def error_lines(command: str, exc: StepError | UsageError) -> list[str]:
    """The lines the command line prints for an error, which `make run` and the Dagster
    UI show first too."""
    if isinstance(exc, UsageError):
        return [f"{PROG}: usage error: {printable(str(exc))}"]
    return [f"{PROG}: {command}: {violation.line()}" for violation in exc.violations]


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (a library's may run over many), or its
    type's name when it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def step_error(rule: str, message: str, step: int | None = None) -> StepError:
    return StepError([Violation(rule=rule, message=message, step=step)])


def os_violation(exc: OSError, where: object, step: int | None = None) -> Violation:
    """An operating-system failure (disk full, permissions) as one readable line."""
    path = exc.filename or where
    if exc.errno == errno.ENOSPC:
        message = f"no space left on {path}"
    else:
        message = f"{exc.strerror or exc} on {path}"
    return Violation(rule="os_error", message=message, step=step)

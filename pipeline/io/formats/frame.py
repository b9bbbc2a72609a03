"""The one frame every trainer's dump is read through: a restricted unpickle, the format's
declared shapes and types (`declared.check`), then its columns, with one mapping of what
can go wrong to one line naming the file.

A format (`DumpFormat`) says how its files are found, unpickled, checked and turned into
rows; `read_dump` gives each the same guarantees: a pickle asking for anything outside the
format's allowlist is `unsafe_pickle` before any of it runs; a file that is no readable
archive or pickle (truncated, corrupt) is `unreadable_file`; a payload that breaks what the
format declares, or that would build more than its size allows, is `malformed_dump`; a
step number beyond int64 is `step_out_of_range`. Never a traceback: whatever else a
hostile file makes fail is still that file's one line, and the other steps are built.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import polars as pl

from pipeline.errors import StepError, Violation, step_error
from pipeline.io.formats.declared import INT64_MAX, Malformed, OutOfRange
from pipeline.io.formats.names import out_of_range
from pipeline.io.formats.unpickle import Refused, TooBig, Unreadable, first_sentence


class DumpFormat(ABC):
    """One trainer's dump format; registered in `pipeline.io.formats.FORMATS` by `name`,
    which is also the `kind` of its `SourceFile`s."""

    name: str
    suffixes: tuple[str, ...]  # what a file of the format is named
    # How messages name a file of the format, and what its pickle may hold.
    what: str
    holds: str

    @abstractmethod
    def is_dump(self, path: Path) -> bool:
        """Whether an input path is (a folder of) this format's dumps."""

    @abstractmethod
    def find(
        self, path: Path, refused: list[Violation] | None = None
    ) -> tuple[dict[int, Path], list[str]]:
        """Step -> dump under an input path that `is_dump` took, and notes on what was
        skipped; what is refused by name (`names`) goes to `refused`, or is raised."""

    @abstractmethod
    def unpickle(self, path: Path) -> Any:
        """The file's payload, through a restricted unpickler (`unpickle.DumpUnpickler`):
        raises Refused, Unreadable or TooBig, never runs code from the file."""

    @abstractmethod
    def rows(
        self, payload: Any, path: Path, step: int | None, options: dict[str, Any]
    ) -> pl.DataFrame:
        """The payload's input rows: checked against the format's declared shapes and types
        first (`declared.check`, Malformed), then mapped to CONTRACT section 1 columns."""

    def step_of(self, payload: Any, path: Path, step: int | None) -> int | None:
        """The step the rows belong to (the path's, unless the payload tells)."""
        return step


def read_dump(fmt: DumpFormat, path: Path, step: int | None = None, **options: Any) -> pl.DataFrame:
    """One input row per row of the dump at `path` (of step `step`, when its path names one)."""
    path = Path(path)
    if step is not None and step > INT64_MAX:
        raise StepError([out_of_range(path, f"step number {step}")])
    try:
        payload = fmt.unpickle(path)
    except Refused as refused:
        raise step_error(
            "unsafe_pickle",
            f"{path}: refused to unpickle: it needs {refused.name}; {fmt.what} holds only "
            f"{fmt.holds}, and loading anything else could run code from the file",
            step,
        ) from None
    except Unreadable as exc:
        raise step_error(
            "unreadable_file", f"{path}: cannot be read as {fmt.what}: {exc}", step
        ) from None
    except (TooBig, Malformed) as exc:
        raise step_error("malformed_dump", f"{path}: {exc}", step) from None
    except MemoryError:
        # The pickle declared a length no file of this size holds.
        raise step_error(
            "malformed_dump",
            f"{path}: asks for more memory than a dump of {path.stat().st_size:,} bytes holds",
            step,
        ) from None
    except RecursionError:
        raise step_error("malformed_dump", f"{path}: a value nested too deeply", step) from None
    except Exception as exc:  # a damaged file fails in many ways: one line, not a traceback
        raise step_error(
            "unreadable_file",
            f"{path}: cannot be read as {fmt.what}, truncated or corrupt? ({first_sentence(exc)})",
            step,
        ) from None
    try:
        step = fmt.step_of(payload, path, step)
        frame = fmt.rows(payload, path, step, options)
    except OutOfRange as exc:
        raise StepError([out_of_range(path, str(exc), step)]) from None
    except (TooBig, Malformed) as exc:
        raise step_error("malformed_dump", f"{path}: {exc}", step) from None
    except StepError as error:
        for violation in error.violations:
            violation.step = step if violation.step is None else violation.step
        raise
    except MemoryError:
        raise step_error(
            "malformed_dump", f"{path}: holds more than its rows may build in memory", step
        ) from None
    except RecursionError:
        raise step_error(
            "malformed_dump", f"{path}: a sample holds a value nested too deeply", step
        ) from None
    except Exception as exc:  # noqa: BLE001 - a payload the declared check let through
        raise step_error(
            "malformed_dump",
            f"{path}: not {fmt.what} this reader can take ({first_sentence(exc)})",
            step,
        ) from None
    return frame

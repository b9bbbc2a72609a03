"""Which files are a build's inputs: the steps under the input paths and their files
(CONTRACT section 1, "Where the files are"). Names only; nothing here reads a table."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import StepError, UsageError, Violation, printable
from pipeline.io.formats import FORMATS
from pipeline.io.formats.names import out_of_range
from pipeline.io.storage import ObjectRoot, is_remote, root_of

TABLE_SUFFIXES = {".parquet": "parquet", ".arrow": "ipc", ".feather": "ipc", ".jsonl": "jsonl"}
# Digits are ASCII: `step=١` (Arabic-Indic) or `step=７` (fullwidth), which `int` would
# read as 1 and 7, name no step.
STEP_NAME = re.compile(r"^step=([0-9]+)(\.[a-z]+)?$")
STEP_FOLDER = re.compile(r"^step=[0-9]+$")
# Names a user may mean as an input that the readers do not take: another case or
# spelling of a table suffix, or a step name with a suffix of no table.
LOOK_ALIKE = re.compile(r"(?i)^step=\w+\.|\.(parquet|parq|pq|arrow|feather|ipc|jsonl|ndjson)$")
# Folders a user may mean as a step that are not `step=<N>` exactly: `Step=3`, `step=+2`,
# `step=4 `, `step=6.0`, `STEP=8`.
STEP_FOLDER_LOOK_ALIKE = re.compile(r"(?i)^\s*step\s*=")
# A producer marks a step folder complete with this file (Spark and Hadoop write it last).
SUCCESS_MARKER = "_SUCCESS"
INT64_MAX = 2**63 - 1


class _OutOfRange(Exception):
    """A name's step number beyond int64 (`step_out_of_range`), refused by name."""

    def __init__(self, violation: Violation) -> None:
        super().__init__(violation.message)
        self.violation = violation


@dataclass(frozen=True)
class SourceFile:
    path: Path
    step: int | None  # from the path; None when only the `step` column tells
    kind: str = "table"  # or the name of a dump format (`pipeline.io.formats.FORMATS`)
    session_version: str | None = None  # overrides a miles dump's inferred session version


def hidden(path: Path) -> bool:
    """Names starting with `_` or `.` are a writer's work in progress or bookkeeping
    (Spark's `_temporary/`, `_SUCCESS`, a `.part` being renamed into place): never read."""
    return path.name.startswith(("_", "."))


def _dangling(path: Path) -> bool:
    return path.is_symlink() and not path.exists()


def _table_name(path: Path) -> bool:
    """A table name; a dangling symlink so named counts (it is that step's unreadable file)."""
    return path.suffix in TABLE_SUFFIXES and (path.is_file() or _dangling(path))


def _is_table(path: Path) -> bool:
    return not hidden(path) and _table_name(path)


def _look_alike(path: Path) -> bool:
    return not hidden(path) and not path.is_dir() and bool(LOOK_ALIKE.search(path.name))


def _named_like_a_step(path: Path) -> bool:
    """A name a user may mean as a step that is not `step=<N>` exactly (`Step=3`,
    `step=+2`, `step=١.parquet`): never read, whether a file or a folder, so that its rows
    are not taken for another step's."""
    return bool(STEP_FOLDER_LOOK_ALIKE.match(path.name)) and _step_of(path) is None


def _ambiguous(step: int | None, first: Path, second: Path, why: str) -> StepError:
    message = f"{first} and {second} {why}: rename or move one of them"
    files = [str(first), str(second)]
    return StepError([Violation("ambiguous_step_path", message, step=step, files=files)])


def _step_of(path: Path) -> int | None:
    match = STEP_NAME.match(path.name)
    if not match:
        return None
    step = int(match.group(1))
    if step > INT64_MAX:
        raise _OutOfRange(out_of_range(path, f"step number {match.group(1)} in the name"))
    return step


def _walk(folder: Path) -> list[Path]:
    """Every entry under `folder` but hidden ones and what is under them, in path order."""
    found = []
    for parent, subfolders, names in os.walk(folder):
        subfolders[:] = [name for name in subfolders if not name.startswith(("_", "."))]
        found += [Path(parent, name) for name in [*subfolders, *names]]
    return sorted((p for p in found if not hidden(p)), key=str)


def _tables_under(folder: Path, skipped: list[Path]) -> list[Path]:
    """The tables of the step folder `folder`. A folder or file inside it naming another
    step would move its rows between steps without a word: both are named instead."""
    step = _step_of(folder)
    tables = []
    for p in _walk(folder):
        if p.is_dir() and STEP_FOLDER.match(p.name):
            raise _ambiguous(step, folder, p, "both name a step, one inside the other")
        inner = _step_of(p)
        if inner is not None and inner != step and _is_table(p):
            raise _ambiguous(step, folder, p, f"name steps {step} and {inner}")
        if _named_like_a_step(p) and not p.is_dir():
            skipped.append(p)
        elif _is_table(p):
            tables.append(p)
        elif _look_alike(p):
            skipped.append(p)
    return tables


def _check_one_name_per_step(children: Sequence[Path]) -> None:
    """In one folder, `step=007` beside `step=7` or `step=1.parquet` beside `step=1/`."""
    first: dict[int, Path] = {}
    for child in children:
        try:
            step = _step_of(child)
        except _OutOfRange:
            continue  # refused by name where it is read
        if step is None or not (child.is_dir() or _is_table(child) or _dangling(child)):
            continue
        seen = first.setdefault(step, child)
        if seen is not child:
            raise _ambiguous(step, seen, child, f"both name step {step}")


def complete(folder: Path) -> bool:
    """Whether a step folder carries its producer's completeness marker."""
    return (folder / SUCCESS_MARKER).is_file()


def _step_folder_sources(
    folder: Path, step: int, passed: list[Path], waiting: list[Path], require_marker: bool
) -> list[SourceFile]:
    if require_marker and not complete(folder):
        waiting.append(folder)
        return []
    return [SourceFile(p, step) for p in _tables_under(folder, passed)]


def find_sources(
    inputs: Sequence[str | Path],
    session_version: str | None = None,
    notes: list[str] | None = None,
    skipped: list[Path] | None = None,
    require_marker: bool = False,
    incomplete: list[Path] | None = None,
    refused: list[Violation] | None = None,
) -> list[SourceFile]:
    """Every table file under the inputs, with the step its path names (CONTRACT section 1);
    the trainers' dump folders and files too (`pipeline.io.formats`). Entries whose name
    starts with `_` or `.` are never read. Notes on skipped files and folders are appended
    to `notes`, and the files and folders that look like inputs but are not read to
    `skipped`. With `require_marker`, a step folder without `_SUCCESS` is not complete
    yet: it is left out with a note, and listed in `incomplete`. Two paths naming one
    step ambiguously are a StepError. A path refused by name (a step number beyond int64,
    a folder or symlink loop named like a dump) is appended to `refused`, the other steps
    still found; without a list, it is a StepError."""
    found: list[SourceFile] = []
    passed: list[Path] = []
    waiting: list[Path] = []
    refusals: list[Violation] = []
    for raw in inputs:
        if is_remote(raw):  # a root in an object store: its steps from one listing
            from pipeline.io.object_sources import object_sources

            root = root_of(str(raw))
            assert isinstance(root, ObjectRoot)
            found += object_sources(root, passed, waiting, require_marker)
            continue
        path = Path(raw)
        if not path.exists() and not path.is_symlink():
            raise UsageError(f"input {path} does not exist")
        fmt = next((f for f in FORMATS.values() if f.is_dump(path)), None)
        if fmt is not None:
            dumps, dump_notes = fmt.find(path, refusals)
            if notes is not None:
                notes.extend(dump_notes)
            found.extend(
                SourceFile(p, step, fmt.name, session_version) for step, p in dumps.items()
            )
            continue
        try:
            found += _table_sources(path, passed, waiting, require_marker, refusals)
        except _OutOfRange as exc:
            refusals.append(exc.violation)
    if refusals and refused is None:
        raise StepError(refusals)
    if refused is not None:
        refused.extend(refusals)
    if notes is not None:
        notes += [_skipped_note(path) for path in passed]
        notes += [
            f"skipped {printable(str(folder))}: no {SUCCESS_MARKER} marker yet "
            "(require_success_marker): the step is not complete, it is built once the "
            "marker is there"
            for folder in waiting
        ]
    if skipped is not None:
        skipped.extend(passed)
    if incomplete is not None:
        incomplete.extend(waiting)
    return found


def _table_sources(
    path: Path,
    passed: list[Path],
    waiting: list[Path],
    require_marker: bool,
    refusals: list[Violation],
) -> list[SourceFile]:
    """The table files of one input path; a child whose name carries a step beyond int64
    is refused by name (`refusals`), its siblings still read."""
    step = _step_of(path)
    if _named_like_a_step(path):
        passed.append(path)
        return []
    if not path.is_dir():
        if not _table_name(path):
            raise UsageError(f"input {path} is not a table (expected {', '.join(TABLE_SUFFIXES)})")
        return [SourceFile(path, step)]
    if step is not None:
        return _step_folder_sources(path, step, passed, waiting, require_marker)
    found: list[SourceFile] = []
    children = sorted((p for p in path.iterdir() if not hidden(p)), key=str)
    _check_one_name_per_step(children)
    for child in children:
        try:
            child_step = _step_of(child)
            if child.is_dir() and child_step is not None:
                found += _step_folder_sources(child, child_step, passed, waiting, require_marker)
            elif _named_like_a_step(child) and (child.is_dir() or _table_name(child)):
                passed.append(child)
            elif _is_table(child) or (child_step is not None and _dangling(child)):
                found.append(SourceFile(child, child_step))
            elif _look_alike(child) or (
                child.is_dir() and STEP_FOLDER_LOOK_ALIKE.match(child.name)
            ):
                passed.append(child)
            elif child.is_dir() and _holds_tables(child):
                passed.append(child)
            elif child.suffix in _dump_suffixes():
                passed.append(child)  # a dump beside tables: named, never read as a table
        except _OutOfRange as exc:
            refusals.append(exc.violation)
    return found


def _holds_tables(folder: Path) -> bool:
    """Whether a folder that is no step folder holds files named like tables, which a
    user may believe are read."""
    return any(_is_table(p) or _look_alike(p) for p in _walk(folder))


def _dump_suffixes() -> set[str]:
    return {suffix for fmt in FORMATS.values() for suffix in fmt.suffixes}


def _skipped_note(path: Path) -> str:
    if path.suffix in _dump_suffixes():
        why = (
            "named like a trainer's dump, in a folder of tables: not read (give the dumps' "
            "folder as an input of its own)"
        )
    elif path.is_dir() and not STEP_FOLDER_LOOK_ALIKE.match(path.name):
        why = "a folder that is not a step folder (step=<N>): the tables under it are not read"
    elif path.is_dir():
        why = "a folder named like a step but not step=<N> exactly (lower case, ASCII digits)"
    else:
        why = (
            "not a regular file named step=<N>.parquet, .arrow, .feather or .jsonl "
            "(lower case, ASCII digits)"
        )
    return f"skipped {printable(str(path))}: {why}"

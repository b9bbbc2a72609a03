"""The steps under an input root in an object store (`s3://bucket/rollouts`): CONTRACT
section 1's layout read from one listing instead of a folder walk.

`step=<N>.<ext>` objects directly under the root and the tables under `step=<N>/` are a
step's files; keys with a part starting with `_` or `.` are never read (a producer's work
in progress), but `step=<N>/_SUCCESS` marks a step folder complete where
`require_success_marker` asks for it. Look-alike names are passed over with a note, as on
disk. A producer writes a step's objects first and `_SUCCESS` last: an object store has no
rename, so the marker is how a step folder says it is whole.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.io import storage
from pipeline.io.discovery import (
    LOOK_ALIKE,
    STEP_FOLDER,
    STEP_FOLDER_LOOK_ALIKE,
    STEP_NAME,
    SUCCESS_MARKER,
    TABLE_SUFFIXES,
    SourceFile,
)
from pipeline.io.discovery import _ambiguous as ambiguous
from pipeline.io.storage import ObjectRoot, object_path


def _step(name: str) -> int | None:
    match = STEP_NAME.match(name)
    return int(match.group(1)) if match else None


def _table(name: str) -> bool:
    return any(name.endswith(suffix) for suffix in TABLE_SUFFIXES)


def object_sources(
    root: ObjectRoot, passed: list[Path], waiting: list[Path], require_marker: bool
) -> list[SourceFile]:
    """Every table object of every step under `root`, in key order (one listing)."""
    keys = [listed.key for listed in storage.listing(root, "")]
    markers = {key.split("/")[0] for key in keys if key.endswith(f"/{SUCCESS_MARKER}")}
    found: list[SourceFile] = []
    named: dict[int, str] = {}  # each step's first top-level name: `step=1.parquet` or `step=1`
    for key in keys:
        parts = key.split("/")
        if any(part.startswith(("_", ".")) for part in parts):
            continue
        top, step = parts[0], _step(parts[0])
        # a step is `step=<N>.<ext>` at the top, or the tables under the folder `step=<N>/`
        is_file = len(parts) == 1 and step is not None and top != f"step={step}"
        is_folder = len(parts) > 1 and STEP_FOLDER.match(top) is not None
        if step is None or not (is_file or is_folder):
            if LOOK_ALIKE.search(parts[-1]) or STEP_FOLDER_LOOK_ALIKE.match(top):
                passed.append(object_path(root, key))
            continue
        if named.setdefault(step, top) != top:
            first, second = object_path(root, named[step]), object_path(root, top)
            raise ambiguous(step, first, second, f"both name step {step}")
        name = parts[-1]
        inner = _step(name)
        if len(parts) > 1 and inner is not None and inner != step and _table(name):
            first, second = object_path(root, top), object_path(root, key)
            raise ambiguous(step, first, second, f"name steps {step} and {inner}")
        if not _table(name):
            if LOOK_ALIKE.search(name):
                passed.append(object_path(root, key))
            continue
        if len(parts) > 1 and require_marker and top not in markers:
            folder = object_path(root, top)
            if folder not in waiting:
                waiting.append(folder)
            continue
        found.append(SourceFile(object_path(root, key), step))
    return found

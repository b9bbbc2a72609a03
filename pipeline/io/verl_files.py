"""Which files are verl's DataProto dumps, and the step of each (names only; reading them
is `pipeline/io/verl_dump.py`'s): a `.dp` file (`DataProto.save_to_disk`), or the rollout
skip manager's step folders `<step>/gen_batch.dp`, complete once verl wrote their
`meta.json` after the batch."""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.errors import UsageError

DUMP_NAME = "gen_batch.dp"
SUFFIX = ".dp"
META = "meta.json"  # written after the batch: the step is complete
STEP_FILE = re.compile(r"^step=(\d+)\.dp$")


def is_verl_dump(path: Path) -> bool:
    """A `.dp` file, a step folder holding `gen_batch.dp`, or a folder of such step folders
    (the rollout skip manager's `GBS<..>_N<..>_in<..>_out<..>`)."""
    if path.is_file():
        return path.suffix == SUFFIX
    if not path.is_dir():
        return False
    if (path / DUMP_NAME).is_file():
        return True
    return any(child.name.isdigit() and (child / DUMP_NAME).is_file() for child in path.iterdir())


def find_verl_dumps(path: Path) -> tuple[dict[int, Path], list[str]]:
    """Step -> `gen_batch.dp` under a dump folder (a step folder is complete once verl wrote
    its `meta.json`, after the batch), or the step of one `.dp` file."""
    notes: list[str] = []
    if path.is_file():
        folder_step = path.parent.name if path.name == DUMP_NAME else ""
        named = STEP_FILE.match(path.name)
        if folder_step.isdigit():
            return {int(folder_step): path}, notes
        if named:
            return {int(named.group(1)): path}, notes
        raise UsageError(
            f"cannot tell the step of {path}: name it step=<N>.dp, or keep verl's "
            f"<step>/{DUMP_NAME}"
        )
    folders = [path] if (path / DUMP_NAME).is_file() else sorted(path.iterdir())
    found: dict[int, Path] = {}
    for folder in folders:
        if not (folder.name.isdigit() and (folder / DUMP_NAME).is_file()):
            continue
        if not (folder / META).is_file():
            notes.append(f"skipped {folder}: no {META} yet (verl writes it after the batch)")
            continue
        found[int(folder.name)] = folder / DUMP_NAME
    if not found and path.name.isdigit() is False and not notes:
        notes.append(f"no <step>/{DUMP_NAME} under {path}")
    return dict(sorted(found.items())), notes

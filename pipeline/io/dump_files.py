"""Finding miles' rollout dumps (`--dump-details D` -> `D/rollout_data/<step>.pt`).

Evaluation rollouts go to `eval_<step>.pt` beside the training dumps, and
`D/dashboard_columns/` mirrors a few columns as Parquet; neither is training data, so both
are skipped with a note.
"""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.errors import UsageError, step_error

ROLLOUT_DATA = "rollout_data"
DUMP_SUFFIX = ".pt"

# `--save-debug-rollout-data` is a template, so besides `<step>.pt` accept a prefix
# ending in `_`, `-` or `=` (`rollout_12.pt`); eval dumps put `eval_` before the step.
# Digits are ASCII (`int` would read `١٢` as 12).
_EVAL_STEM = re.compile(r"^(?:.*[_=-])?eval_([0-9]+)$")
_STEP_STEM = re.compile(r"^(?:.*[_=-])?([0-9]+)$")


def eval_step(path: Path) -> int | None:
    match = _EVAL_STEM.match(path.stem)
    return int(match.group(1)) if match else None


def named_step(path: Path) -> int | None:
    """The step a training dump's name carries; None for eval dumps and other names."""
    match = _STEP_STEM.match(path.stem)
    return int(match.group(1)) if match and eval_step(path) is None else None


def _dump_files(folder: Path) -> list[Path]:
    return sorted(
        (
            p
            for p in folder.iterdir()
            if p.is_file() and p.suffix == DUMP_SUFFIX and not p.name.startswith(".")
        ),
        key=lambda p: p.name,
    )


def is_miles_dump(path: Path) -> bool:
    """A `.pt` file, a `rollout_data` folder, or a `--dump-details` folder with dumps."""
    path = Path(path)
    if path.is_file():
        return path.suffix == DUMP_SUFFIX
    if not path.is_dir():
        return False
    if path.name == ROLLOUT_DATA:
        return True
    rollout_data = path / ROLLOUT_DATA
    return rollout_data.is_dir() and bool(_dump_files(rollout_data))


def find_miles_dumps(path: Path) -> tuple[dict[int, Path], list[str]]:
    """Step -> dump file under a `--dump-details` folder, a `rollout_data` folder or one file.

    Returns the steps in ascending order and notes on what was skipped (eval dumps, files
    not named for a step, sibling folders of `rollout_data`).
    """
    path = Path(path)
    notes: list[str] = []
    if path.is_file():
        if path.suffix != DUMP_SUFFIX:
            raise UsageError(f"input {path} is not a miles dump (expected <step>{DUMP_SUFFIX})")
        candidates = [path]
    elif path.is_dir():
        folder = path
        if path.name != ROLLOUT_DATA and (path / ROLLOUT_DATA).is_dir():
            folder = path / ROLLOUT_DATA
            ignored = sorted(
                p.name + "/" for p in path.iterdir() if p.is_dir() and p.name != ROLLOUT_DATA
            )
            if ignored:
                notes.append(
                    f"ignored {', '.join(ignored)} in {path} (only {ROLLOUT_DATA}/ is read)"
                )
        candidates = _dump_files(folder)
        if not candidates:
            notes.append(f"no <step>{DUMP_SUFFIX} files in {folder}")
    else:
        raise UsageError(f"input {path} does not exist")

    found: dict[int, Path] = {}
    for file in candidates:
        if eval_step(file) is not None:
            notes.append(f"skipped eval dump {file.name}")
            continue
        step = named_step(file)
        if step is None:
            if file == path:
                raise UsageError(
                    f"cannot tell the step of {file}: miles names dumps <step>{DUMP_SUFFIX}"
                )
            notes.append(f"skipped {file.name}: not named <step>{DUMP_SUFFIX}")
            continue
        if step in found:
            raise step_error(
                "duplicate_step",
                f"{found[step]} and {file} are both dumps of step {step}; keep one",
                step=step,
            )
        found[step] = file
    return dict(sorted(found.items())), notes

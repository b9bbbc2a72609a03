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
    """A `.pt` file, a `rollout_data` folder, a `--dump-details` folder with dumps, or a
    folder `--save-debug-rollout-data` wrote into (`<prefix><step>.pt` files, and no
    `step=<N>` tables beside them)."""
    path = Path(path)
    if path.is_file():
        return path.suffix == DUMP_SUFFIX
    if not path.is_dir():
        return False
    if path.name == ROLLOUT_DATA:
        return True
    rollout_data = path / ROLLOUT_DATA
    if rollout_data.is_dir() and bool(_dump_files(rollout_data)):
        return True
    named = [p for p in _dump_files(path) if named_step(p) is not None]
    return bool(named) and not any(p.name.startswith("step=") for p in path.iterdir())


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


# verl's dumps (`pipeline.io.verl_dump` reads them): a step folder per step, each holding
# the batch and, written after it, its meta.
DUMP_NAME = "gen_batch.dp"
SUFFIX = ".dp"
META = "meta.json"
STEP_FILE = re.compile(r"^step=([0-9]+)\.dp$")


def _step_digits(name: str) -> bool:
    """A step number in ASCII digits (`str.isdigit` also takes other scripts' digits)."""
    return name.isascii() and name.isdigit()


def is_verl_dump(path: Path) -> bool:
    """A `.dp` file, a step folder holding `gen_batch.dp`, or a folder of such step folders
    (the rollout skip manager's `GBS<..>_N<..>_in<..>_out<..>`)."""
    if path.is_file():
        return path.suffix == SUFFIX
    if not path.is_dir():
        return False
    if (path / DUMP_NAME).is_file():
        return True
    return any(
        _step_digits(child.name) and (child / DUMP_NAME).is_file() for child in path.iterdir()
    )


def find_verl_dumps(path: Path) -> tuple[dict[int, Path], list[str]]:
    """Step -> `gen_batch.dp` under a dump folder (a step folder is complete once verl wrote
    its `meta.json`, after the batch), or the step of one `.dp` file."""
    notes: list[str] = []
    if path.is_file():
        folder_step = path.parent.name if path.name == DUMP_NAME else ""
        named = STEP_FILE.match(path.name)
        if _step_digits(folder_step):
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
        if not (_step_digits(folder.name) and (folder / DUMP_NAME).is_file()):
            continue
        if not (folder / META).is_file():
            notes.append(f"skipped {folder}: no {META} yet (verl writes it after the batch)")
            continue
        found[int(folder.name)] = folder / DUMP_NAME
    if not found and not _step_digits(path.name) and not notes:
        notes.append(f"no <step>/{DUMP_NAME} under {path}")
    return dict(sorted(found.items())), notes

"""Where the trainers' dumps are and what their names say. Names only: nothing is read.

miles and slime (`--dump-details D` -> `D/rollout_data/<step>.pt`, or
`--save-debug-rollout-data` templates such as `rollout_{rollout_id}.pt`): evaluation
rollouts go to `eval_<step>.pt` beside the training dumps and `D/dashboard_columns/`
mirrors a few columns as Parquet; neither is training data, so both are skipped with a note.
verl (the rollout skip manager's `<folder>/<step>/gen_batch.dp`, its `meta.json` written
after the batch, or single `step=<N>.dp` files).

Every finder answers alike for what it cannot take: a step number beyond int64 in a name
is `step_out_of_range`, and an entry named like a dump but for no step that is no regular
file (a folder, a symlink loop, a dangling symlink, a FIFO) is `unreadable_file`; both name
the path and are appended to `refused` (raised at once when no list is given), so the
other steps are still found. An entry named for a step is that step's dump whatever it
is, as a table's name is: its read fails with one line (`io.load`), the other steps built
(by Dagster's sensor too). Nothing named like a dump is passed over without a word.
"""

from __future__ import annotations

import errno
import re
import stat
from pathlib import Path

from pipeline.errors import StepError, UsageError, Violation, step_error
from pipeline.io.formats.declared import INT64_MAX

ROLLOUT_DATA = "rollout_data"
DUMP_SUFFIX = ".pt"

# `--save-debug-rollout-data` is a template, so besides `<step>.pt` accept a prefix
# ending in `_`, `-` or `=` (`rollout_12.pt`); eval dumps put `eval_` before the step.
# Digits are ASCII (`int` would read `١٢` as 12).
_EVAL_STEM = re.compile(r"^(?:.*[_=-])?eval_([0-9]+)$")
_STEP_STEM = re.compile(r"^(?:.*[_=-])?([0-9]+)$")

DUMP_NAME = "gen_batch.dp"
SUFFIX = ".dp"
META = "meta.json"
STEP_FILE = re.compile(r"^step=([0-9]+)\.dp$")


def out_of_range(path: Path, what: str, step: int | None = None) -> Violation:
    return Violation(
        "step_out_of_range",
        f"{what} is beyond int64: no step can carry it",
        step=step,
        files=[str(path)],
    )


def _refuse(refused: list[Violation] | None, violation: Violation) -> None:
    if refused is None:
        raise StepError([violation])
    refused.append(violation)


def _number(digits: str, path: Path, refused: list[Violation] | None) -> int | None:
    """The step `digits` name, or None (refused) beyond int64."""
    step = int(digits)
    if step > INT64_MAX:
        _refuse(refused, out_of_range(path, f"step number {digits} in the name"))
        return None
    return step


def not_a_file(path: Path) -> str | None:
    """Why `path` is no regular file (what a reader would meet opening it), or None."""
    try:
        info = path.stat()
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symlink loop"
        return "a dangling symlink" if path.is_symlink() else (exc.strerror or "unreadable")
    if stat.S_ISREG(info.st_mode):
        return None
    return "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file"


def present(path: Path) -> bool:
    """Whether anything is at `path`, a symlink loop or a dangling symlink included."""
    return path.exists() or path.is_symlink()


def _not_a_dump(path: Path, why: str, step: int | None, what: str) -> Violation:
    return Violation(
        "unreadable_file",
        f"named like {what} but {why}, not a file: nothing of it is read (move or rename it)",
        step=step,
        files=[str(path)],
    )


# --- miles and slime -------------------------------------------------------------------


def eval_step(path: Path) -> int | None:
    match = _EVAL_STEM.match(path.stem)
    return int(match.group(1)) if match else None


def _step_digits(path: Path) -> str | None:
    """The digits of the step a training dump's name carries; None for eval dumps."""
    match = _STEP_STEM.match(path.stem)
    return match.group(1) if match and _EVAL_STEM.match(path.stem) is None else None


def named_step(path: Path) -> int | None:
    """The step a training dump's name carries (beyond int64 too); None for other names."""
    digits = _step_digits(path)
    return int(digits) if digits is not None else None


def _dump_entries(folder: Path) -> list[Path]:
    """Entries named `*.pt`, whatever they are: a folder or a symlink loop so named is
    refused by name, not skipped."""
    return sorted(
        (p for p in folder.iterdir() if p.suffix == DUMP_SUFFIX and not p.name.startswith(".")),
        key=lambda p: p.name,
    )


def is_miles_dump(path: Path) -> bool:
    """A `.pt` path, a `rollout_data` folder, a `--dump-details` folder with dumps, or a
    folder `--save-debug-rollout-data` wrote into (`<prefix><step>.pt` entries, and no
    `step=<N>` tables beside them)."""
    path = Path(path)
    if path.suffix == DUMP_SUFFIX and not path.is_dir():
        return present(path)
    if not path.is_dir():
        return False
    if path.name == ROLLOUT_DATA:
        return True
    rollout_data = path / ROLLOUT_DATA
    if rollout_data.is_dir() and bool(_dump_entries(rollout_data)):
        return True
    named = [p for p in _dump_entries(path) if _step_digits(p) is not None]
    return bool(named) and not any(p.name.startswith("step=") for p in path.iterdir())


def find_miles_dumps(
    path: Path, refused: list[Violation] | None = None
) -> tuple[dict[int, Path], list[str]]:
    """Step -> dump file under a `--dump-details` folder, a `rollout_data` folder or one file.

    Returns the steps in ascending order and notes on what was skipped (eval dumps, files
    not named for a step, sibling folders of `rollout_data`); what is refused by name goes
    to `refused` (module docstring).
    """
    path = Path(path)
    notes: list[str] = []
    what = f"a miles dump (<step>{DUMP_SUFFIX})"
    if path.suffix == DUMP_SUFFIX and not path.is_dir() and present(path):
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
        candidates = _dump_entries(folder)
        if not candidates:
            notes.append(f"no <step>{DUMP_SUFFIX} files in {folder}")
    elif not present(path):
        raise UsageError(f"input {path} does not exist")
    else:
        raise UsageError(f"input {path} is not a miles dump (expected <step>{DUMP_SUFFIX})")

    found: dict[int, Path] = {}
    for file in candidates:
        if eval_step(file) is not None:
            notes.append(f"skipped eval dump {file.name}")
            continue
        digits = _step_digits(file)
        step = _number(digits, file, refused) if digits is not None else None
        if digits is not None and step is None:
            continue
        why = not_a_file(file)
        if why is not None and step is None:
            _refuse(refused, _not_a_dump(file, why, step, what))
            continue
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


# --- verl ---------------------------------------------------------------------------


def _digits(name: str) -> bool:
    """A step number in ASCII digits (`str.isdigit` also takes other scripts' digits)."""
    return name.isascii() and name.isdigit()


def is_verl_dump(path: Path) -> bool:
    """A `.dp` path, a step folder holding `gen_batch.dp`, or a folder of such step folders
    (the rollout skip manager's `GBS<..>_N<..>_in<..>_out<..>`)."""
    if path.suffix == SUFFIX and not path.is_dir():
        return present(path)
    if not path.is_dir():
        return False
    if present(path / DUMP_NAME):
        return True
    return any(_digits(child.name) and present(child / DUMP_NAME) for child in path.iterdir())


def find_verl_dumps(
    path: Path, refused: list[Violation] | None = None
) -> tuple[dict[int, Path], list[str]]:
    """Step -> `gen_batch.dp` under a dump folder (a step folder is complete once verl wrote
    its `meta.json`, after the batch), or the step of one `.dp` file; what is refused by
    name goes to `refused` (module docstring)."""
    notes: list[str] = []
    what = f"a verl dump (<step>/{DUMP_NAME} or step=<N>{SUFFIX})"
    if not path.is_dir():
        folder_step = path.parent.name if path.name == DUMP_NAME else ""
        named = STEP_FILE.match(path.name)
        digits = folder_step if _digits(folder_step) else named.group(1) if named else None
        step = _number(digits, path, refused) if digits is not None else None
        why = not_a_file(path)
        if why is not None and digits is None:
            _refuse(refused, _not_a_dump(path, why, step, what))
        elif digits is None:
            raise UsageError(
                f"cannot tell the step of {path}: name it step=<N>.dp, or keep verl's "
                f"<step>/{DUMP_NAME}"
            )
        return ({step: path} if step is not None else {}), notes
    folders = [path] if present(path / DUMP_NAME) else sorted(path.iterdir())
    found: dict[int, Path] = {}
    for stray in (p for p in folders if p.suffix == SUFFIX and not p.name.startswith(".")):
        why = not_a_file(stray)
        if why is not None:
            _refuse(refused, _not_a_dump(stray, why, None, what))
        else:
            notes.append(f"skipped {stray}: verl's dumps are read as <step>/{DUMP_NAME}")
    for folder in folders:
        dump = folder / DUMP_NAME
        if not (_digits(folder.name) and present(dump)):
            continue
        step = _number(folder.name, folder, refused)
        if step is None:
            continue
        if not (folder / META).is_file():
            notes.append(f"skipped {folder}: no {META} yet (verl writes it after the batch)")
            continue
        found[step] = dump
    if not found and not _digits(path.name) and not notes and not refused:
        notes.append(f"no <step>/{DUMP_NAME} under {path}")
    return dict(sorted(found.items())), notes

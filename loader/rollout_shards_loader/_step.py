"""One read of a rank's files, all of one build: the step folder opened, its manifest
checked against the settings the trainer runs with, the rank's own file mapped and the
other ranks' digest-covered columns read, every file verified; the read starts over when
a rebuild replaces the folder. Also the wait for a step that is not built yet."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from rollout_shards_loader import _remote as remote
from rollout_shards_loader._consistent import check_rows
from rollout_shards_loader._folder import MANIFEST, Folder, Replaced, open_folder, rank_name
from rollout_shards_loader._manifest import ATTEMPTS, load_manifest, trainer_of
from rollout_shards_loader._remote import RemoteFolder, Url, is_remote
from rollout_shards_loader._verify import DIGESTED, Checks, open_other_file, open_own_file
from rollout_shards_loader._verify import _raw_reward_sha256 as raw_sha256

T = TypeVar("T")
# Seconds between two looks for a step's manifest while waiting for it.
WAIT_POLL_S = 0.5


class RankFiles(NamedTuple):
    """What one read has open: the step folder's path, the manifest, every rank's
    ParquetFile in rank order, the other ranks' `batch_position` and `raw_reward`, and the
    reading rank's file mapped."""

    folder: Path | Url
    manifest: dict[str, Any]
    files: list[pq.ParquetFile]
    parts: dict[int, pa.Table]
    own: pa.Buffer


# Where a build that refused a step leaves why (pipeline/step/refused.py writes it).
REFUSED_FOLDER = "_refused"


class StepNotBuiltError(TimeoutError):
    """A step the trainer asked for has no manifest after the wait: nothing built it."""


class StepRefusedError(RuntimeError):
    """The build of a step the trainer asked for refused it (its data broke a rule, or its
    settings could not be met): it will not come until its input or settings are fixed."""


def refusal(step_folder: Path) -> StepRefusedError | None:
    """The error of a refused step (its record under `<root>/_refused/`), or None."""
    record_path = step_folder.parent / REFUSED_FOLDER / f"{step_folder.name}.json"
    try:
        text = record_path.read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as error:
        text = f'{{"lines": ["its record cannot be read: {error.strerror}"]}}'
    try:
        record = json.loads(text)
        lines = [str(line) for line in record["lines"]]
        when = f" at {record['refused_at']}" if "refused_at" in record else ""
    except (ValueError, KeyError, TypeError):
        lines, when = ["its record cannot be read"], ""
    more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
    first = " ".join(lines[0].split()) if lines else "no rule named"
    return StepRefusedError(
        f"{step_folder}: the step was refused by its build{when}: {first}{more}; "
        f"`rollout-shards validate {step_folder.parent}` shows it all ({record_path}); fix "
        "the step's input or settings and build it again"
    )


def wait_for_step(step_folder: str | Path, timeout_s: float) -> None:
    """Return once `step_folder` has its manifest (the build's last write), waiting up to
    `timeout_s` seconds; then StepNotBuiltError, one line naming the command that builds
    the step. A step whose build refused it (`<root>/_refused/step=<N>.json`) fails at
    once with StepRefusedError: the refusal's first line and the command that shows it."""
    step_folder = Path(step_folder)
    deadline = time.monotonic() + timeout_s
    while not os.path.isfile(step_folder / MANIFEST):
        refused = refusal(step_folder)
        if refused is not None:
            raise refused
        if time.monotonic() >= deadline:
            raise StepNotBuiltError(
                f"{step_folder}: the step is not built (no {MANIFEST} after waiting "
                f"{timeout_s:g} s): build it with `rollout-shards build <the rollouts "
                f"folder holding {step_folder.name}> --out {step_folder.parent}`, before "
                "training or alongside it"
            )
        time.sleep(min(WAIT_POLL_S, max(0.0, deadline - time.monotonic())))


def read_rank_files(
    step_folder: str | Path,
    rank: int,
    dp_size: int | None,
    global_batch_size: int | None,
    verify: bool,
    convert: Callable[[RankFiles], T],
    trainer: str = "miles",
    other_columns: Sequence[str] = DIGESTED,
) -> T:
    """`convert` of rank `rank`'s files of a step built for `trainer`, all of one build (up
    to ATTEMPTS reads while rebuilds replace the folder, then RuntimeError);
    `other_columns` are the columns read of every other rank's file (`RankFiles.parts`)."""
    remote = is_remote(step_folder)
    folder = Url(step_folder) if remote else Path(step_folder)
    for attempt in range(ATTEMPTS):
        try:
            return read_once(
                folder, rank, dp_size, global_batch_size, verify, convert, trainer, other_columns
            )
        except FileNotFoundError:
            # no step, or none complete: was it refused? (a record on disk only)
            refused = None if remote else refusal(Path(folder))
            if refused is not None and not os.path.isfile(folder / MANIFEST):
                raise refused from None
            raise
        except Replaced:
            time.sleep(0.002 * (attempt + 1))
    raise RuntimeError(
        f"{folder}: replaced by other builds {ATTEMPTS} times while it was read; try again"
    )


def _open_files(
    folder: Folder | RemoteFolder,
    manifest: dict[str, Any],
    rank: int,
    verify: bool,
    checks: Checks,
    other_columns: Sequence[str],
    files: dict[int, pq.ParquetFile],
    parts: dict[int, pa.Table],
    handles: list[Any],
) -> pa.Buffer:
    """Open every rank's file of the step into `files`, `parts` and `handles` (to close);
    the reading rank's file mapped (on disk) or fetched (from an object store)."""
    step_dp = manifest["settings"]["dp_size"]
    if isinstance(folder, RemoteFolder):
        files[rank], own = remote.open_own_file(folder, manifest, rank_name(rank), verify)
        for r in range(step_dp):
            if r != rank:
                files[r], handle, parts[r] = remote.open_other_file(
                    folder, manifest, rank_name(r), verify, other_columns, DIGESTED, raw_sha256
                )
                handles.append(handle)
        return own
    # the own file first: its sha256 runs on a thread while the rest is read
    files[rank], own = open_own_file(folder, manifest, rank_name(rank), verify, checks)
    for r in range(step_dp):
        if r != rank:
            files[r], handle, parts[r] = open_other_file(
                folder, manifest, rank_name(r), verify, checks, other_columns
            )
            handles.append(handle)
    return own


def read_once(
    path: Path | Url,
    rank: int,
    dp_size: int | None,
    global_batch_size: int | None,
    verify: bool,
    convert: Callable[[RankFiles], T],
    trainer: str,
    other_columns: Sequence[str] = DIGESTED,
) -> T:
    """One read (`Replaced` when the folder was swapped under it) of a step built for
    `trainer` (another trainer's step is a ValueError naming its reader)."""
    folder: Folder | RemoteFolder
    folder = RemoteFolder(path) if isinstance(path, Url) else open_folder(Path(path))
    try:
        manifest = load_manifest(folder, trainer)  # type: ignore[arg-type]
        step_dp = manifest["settings"]["dp_size"]
        step_gbs = manifest["settings"].get("global_batch_size")
        if dp_size is not None and dp_size != step_dp:
            raise ValueError(
                f"dp_size={dp_size} but the step {path} was built for dp_size={step_dp}"
            )
        if global_batch_size is not None and global_batch_size != step_gbs:
            raise ValueError(
                f"global_batch_size={global_batch_size} but the step {path} was built for "
                f"global_batch_size={step_gbs}"
            )
        if not 0 <= rank < step_dp:
            raise ValueError(f"rank={rank} is outside the step's dp_size={step_dp} ranks")
        files: dict[int, pq.ParquetFile] = {}
        parts: dict[int, pa.Table] = {}
        handles: list[Any] = []
        checks = Checks(folder)  # type: ignore[arg-type]
        try:
            try:
                own = _open_files(
                    folder, manifest, rank, verify, checks, other_columns, files, parts, handles
                )
                ordered = [files[r] for r in range(step_dp)]
                # the one verification every trainer's conversion starts from
                # a Url names like a Path in the check's messages
                check_rows(path, manifest, rank, own, parts, trainer_of(manifest))  # type: ignore[arg-type]
                data = convert(RankFiles(path, manifest, ordered, parts, own))
            except Exception:
                checks.wait()  # a file that is not the manifest's is the error to report
                raise
            checks.wait()
            return data
        finally:
            checks.close()
            for handle in handles:
                handle.close()
    finally:
        folder.close()

"""Every reader gives the same answer: each `build` case of the bad-input corpus
(bad_inputs/generate.py) is built through `pipeline.cli.main` by each reader of a step (in
memory; in parts with a spill; in Ray shares, with the shares' tasks run in this process),
in the same folder, and every reader must give the in-memory read's exit status, stdout,
stderr lines and every byte of what it leaves in the case folder (shards, manifest,
quarantine, dataset card, a refused step's record but its time), nothing more.

The parts are tiny (one row each) and every Parquet row group is a share of its own, so a
step of the corpus comes in many parts and shares. The reader is handed in as the CLI's
`--ray` route is (`commands.ray_route`), for every step a build writes. The other commands
of the corpus (`validate`, `parity`, `metrics`, the Dagster `stage` entry) and the cases
run as programs (closed stdout, signals) never read through a build's reader:
test_bad_inputs.py runs them.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import re
import shutil
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from pipeline import commands
from pipeline.step.build import StepJob
from pipeline.step.readers import shares
from pipeline.step.readers.spill import Spill, SpillReader
from tests.core.bad_inputs.generate import ARGS, Case, cases, write_case
from tests.support.cli import in_process
from tests.support.samples import entries

BUILD_CASES = {
    case.name: case
    for case in cases()
    if case.command == "build" and case.stdout is None and case.signal is None
}
TINY = 1  # bytes of a part, or of a share: one row, or one row group, each


@dataclass(frozen=True)
class Outcome:
    status: int
    stdout: str
    stderr: list[str]
    folder: dict[str, tuple[str, str]]


def _spill_route(job: StepJob) -> StepJob:
    def reader(job: StepJob, stack: contextlib.ExitStack) -> SpillReader:
        assert job.out_root is not None
        return SpillReader(stack.enter_context(Spill(job.out_root, job.step)), TINY)

    return replace(job, reader=reader)


def _shares_route(job: StepJob) -> StepJob:
    return shares.by_tasks(job, shares.LocalTasks())


ROUTES: dict[str, Callable[[StepJob], StepJob] | None] = {
    "memory": None,
    "spill": _spill_route,
    "shares": _shares_route,
}


def _untimed_record(path: Path) -> str:
    """A refused step's record but its time (`refused_at` differs between two builds of
    the same case, like the progress lines' times): every other byte must agree."""
    record = json.loads(path.read_text())
    datetime.datetime.fromisoformat(record.pop("refused_at"))
    return json.dumps(record, sort_keys=True)


def _snapshot(folder: Path) -> dict[str, tuple[str, str]]:
    """Every entry under the case folder but the step locks: kind and content."""
    found: dict[str, tuple[str, str]] = {}
    for key, path in entries(folder):
        if key.startswith("out/.locks"):
            continue
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode):
            found[key] = ("link", os.readlink(path))
        elif stat.S_ISREG(mode) and key.startswith("out/_refused/"):
            found[key] = ("refusal", _untimed_record(path))
        elif stat.S_ISREG(mode):
            found[key] = ("file", hashlib.sha256(path.read_bytes()).hexdigest())
        else:
            found[key] = ("dir" if stat.S_ISDIR(mode) else "other", "")
    return found


def _placed(text: str, folder: Path) -> str:
    return text.replace("{input}", str(folder / "input")).replace("{case}", str(folder))


def _prepare(folder: Path, steps: list[dict[str, Any]]) -> None:
    """What a case asks before its command (generate.py): a build, a FIFO, a link."""
    for step in steps:
        ((op, value),) = step.items()
        if op == "build":
            done = in_process(["build", str(folder / "input"), "--out", str(folder / value), *ARGS])
            assert done.returncode == 0, done.stderr
        elif op == "fifo":
            (folder / value).unlink()
            os.mkfifo(folder / value)
        else:
            assert op == "link", op
            (folder / value[0]).unlink()
            os.symlink(value[1], folder / value[0])


def build_case(case: Case, root: Path, reader: str, monkeypatch: pytest.MonkeyPatch) -> Outcome:
    """The case written afresh under `root` and built by `reader`."""
    folder = root / case.name
    if folder.exists():
        shutil.rmtree(folder)
    write_case(case, root)
    route = ROUTES[reader]

    @contextlib.contextmanager
    def routed(settings: Any, in_ray_job: bool = False) -> Iterator[Any]:
        yield route

    with monkeypatch.context() as patch:
        patch.setattr(commands, "ray_route", routed)
        patch.setattr(shares, "SHARE_BYTES", TINY)
        patch.setattr(shares, "PART_BYTES", TINY)
        _prepare(folder, case.prepare)
        args = [_placed(a, folder) for a in [*ARGS, *case.args]]
        done = in_process(["build", str(folder / "input"), "--out", str(folder / "out"), *args])
        status, stdout, stderr = done.returncode, done.stdout, done.stderr
    # progress lines time each stage: the times aside, stdout is the same
    untimed = re.sub(r"\([0-9.]+ s\)", "(s)", stdout)
    return Outcome(status, untimed, stderr.splitlines(), _snapshot(folder))


@pytest.fixture(scope="module")
def in_memory() -> dict[str, Outcome]:
    """Each case's in-memory outcome, built once for both other readers."""
    return {}


@pytest.mark.parametrize("reader", ["spill", "shares"])
@pytest.mark.parametrize("name", list(BUILD_CASES))
def test_every_reader_answers_as_in_memory(
    name: str,
    reader: str,
    in_memory: dict[str, Outcome],
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    case = BUILD_CASES[name]
    root = tmp_path_factory.getbasetemp() / "readers_agree"
    if name not in in_memory:
        in_memory[name] = build_case(case, root, "memory", monkeypatch)
    expected = in_memory[name]
    got = build_case(case, root, reader, monkeypatch)
    assert "Traceback" not in "\n".join(got.stderr), "\n".join(got.stderr)
    assert got.status == expected.status, got.stderr
    assert got.stderr == expected.stderr
    assert got.stdout == expected.stdout
    assert got.folder == expected.folder


def test_the_corpus_holds_the_cases_the_readers_once_disagreed_on() -> None:
    assert {
        "uint64_token_above_int64",
        "zero_row_step_beside_a_valid_one",
        "dictionary_strings_in_lists_across_row_groups",
        "corrupted_pages",
    } <= set(BUILD_CASES)
    assert len(BUILD_CASES) >= 180

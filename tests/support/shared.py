"""A service shared by the pytest workers of one session (a Ray head, a Ray cluster): the
first user starts it, each user counts itself in and out, and the last one out stops it.
Its state is a JSON file in the session's folder, read and written under an exclusive lock,
so that workers that overlap share one service where each would start its own."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    import pytest


class Service(Protocol):
    """What the lock file records of a service: a dataclass with the pid that stops it."""

    __dataclass_fields__: dict[str, Any]
    pid: int


S = TypeVar("S", bound=Service)


def session_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the whole session: under xdist each worker has its own base temp, and
    their parent is the session's."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def alive(pid: int) -> bool:
    """Whether `pid` runs: a zombie (state Z) has exited, its parent has not reaped it yet."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@contextmanager
def _locked(path: Path) -> Iterator[Path]:
    """`path`, held under an exclusive lock of its own."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.with_name(f"{path.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield path
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextmanager
def shared(
    state_file: Path, kind: type[S], start: Callable[[], S], stop: Callable[[S], None]
) -> Iterator[S]:
    """The service recorded in `state_file` when it still runs, else one `start` gives;
    stopped by `stop` when its last user leaves."""
    with _locked(state_file):
        state = json.loads(state_file.read_text()) if state_file.exists() else None
        if state is not None and alive(state["service"]["pid"]):
            service = kind(**state["service"])
            state["users"] += 1
        else:
            service = start()
            state = {"service": dataclasses.asdict(service), "users": 1}
        state_file.write_text(json.dumps(state))
    try:
        yield service
    finally:
        with _locked(state_file):
            state = json.loads(state_file.read_text())
            state["users"] -= 1
            if state["users"] == 0:
                stop(service)
                state_file.unlink()
            else:
                state_file.write_text(json.dumps(state))

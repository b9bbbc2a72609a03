"""The hook that trains a Megatron-family trainer (miles, slime) from rollout-shards step
folders without a fork of it.

The trainer gets its rank's data in one call: `process_rollout_data(args,
rollout_data_ref, dp_rank, dp_size, ...)`, a name imported into its data module and so
looked up there at call time. The training actor's `train(self, rollout_id, ...)` knows
the step. `install` wraps both: `train` sets the rollout id for the duration of the call,
and `process_rollout_data` waits for `<root>/step=<rollout_id>` to be built (up to
`wait_s`, `ROLLOUT_SHARDS_WAIT_S`), then returns the trainer module's
`read_rank(<root>/step=<rollout_id>, dp_rank, ...)` in the shape the installed trainer
expects: since miles #591 the pair `(rank dict, handle)` whose handle `train()` enters as
a context (`ObjectStoreGetResult`), before it (and in slime) the rank dict alone.

Ray takes an actor's methods when it loads the actor class in a worker, so the wrapping
must happen before that: `runtime_env(root, hook=...)` gives the Ray runtime environment
whose `worker_process_setup_hook` installs in every worker before any actor is created, and
the wrapping itself waits until the trainer's modules are imported. A
`process_rollout_data` call outside a wrapped `train` means the install came too late (Ray
kept the unwrapped `train`): it raises instead of handing the trainer the rollout side's
own batch.
"""

from __future__ import annotations

import contextvars
import functools
import os
import sys
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rollout_shards_loader._imports import LOCK, PatchingFinder
from rollout_shards_loader._step import wait_for_step

ROOT_ENV = "ROLLOUT_SHARDS_ROOT"
# How long the hook waits for a step to be built before it fails (seconds): long enough
# for a build running alongside training to commit the step the trainer asks for next.
WAIT_ENV = "ROLLOUT_SHARDS_WAIT_S"
WAIT_S = 600.0
ORIGINAL = "_rollout_shards_original"  # not __wrapped__: the trainers' decorators set that
# miles' handle class since #591; a data module without it returns the rank dict alone.
PAIR_MARKER = "ObjectStoreGetResult"

_ROLLOUT_ID: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "rollout_shards_rollout_id", default=None
)
# What answers `process_rollout_data`: a trainer module's `read_rank`, and that module's
# name (the one a user installs from, named in errors).
Reader = Callable[..., Any]


class LateInstallError(RuntimeError):
    """`process_rollout_data` ran outside a wrapped `train`: Ray loaded the actor class
    before `install`, so the trainer would train on the rollout side's batch."""


def runtime_env(
    root: str | Path,
    base: dict[str, Any] | None = None,
    *,
    hook: str,
    wait_s: float | None = None,
) -> dict[str, Any]:
    """The Ray runtime environment (for `ray job submit --runtime-env-json` or
    `ray.init(runtime_env=...)`) that installs the hook in every worker of the job before
    any actor exists: `base` plus `worker_process_setup_hook` and `ROLLOUT_SHARDS_ROOT`
    (and `ROLLOUT_SHARDS_WAIT_S` when `wait_s` is given)."""
    env = dict(base or {})
    if env.get("worker_process_setup_hook") not in (None, hook):
        module = hook.rpartition(".")[0]
        raise ValueError(
            "the runtime env already has a worker_process_setup_hook "
            f"({env['worker_process_setup_hook']!r}): call "
            f"{module}.install(root) from it instead"
        )
    env["worker_process_setup_hook"] = hook
    env_vars = {**env.get("env_vars", {}), ROOT_ENV: str(root)}
    if wait_s is not None:
        env_vars[WAIT_ENV] = str(_wait_seconds(wait_s, "wait_s"))
    env["env_vars"] = env_vars
    return env


def setup_root(hook: str) -> str:
    """The root a Ray `worker_process_setup_hook` installs from: `$ROLLOUT_SHARDS_ROOT`."""
    root = os.environ.get(ROOT_ENV)
    if not root:
        module = hook.rpartition(".")[0]
        raise RuntimeError(
            f"{hook} needs {ROOT_ENV} in the runtime env's env_vars "
            f"({module}.runtime_env(root) sets both)"
        )
    return root


def install(
    root: str | Path,
    *,
    data_module: str,
    actors: Sequence[str],
    reader: Reader,
    owner: str,
    wait_s: float | None = None,
) -> None:
    """Make a trainer read rank data from `<root>/step=<rollout_id>/`.

    Modules already imported are patched now; the others when they are imported (nothing
    of the trainer is imported here). `actors` are the `module:Class` training actors whose
    `train(rollout_id, ...)` is wrapped; `data_module` the module whose
    `process_rollout_data` the trainer calls, `reader` the `read_rank` that answers it and
    `owner` the loader module a user installs from. A step not built yet is waited for up to
    `wait_s` seconds (unset: `$ROLLOUT_SHARDS_WAIT_S`, else 600; 0 fails at once), then
    fails naming the command that builds it. Installing twice wraps once."""
    if wait_s is None:
        wait = _wait_seconds(os.environ.get(WAIT_ENV, WAIT_S), WAIT_ENV)
    else:
        wait = _wait_seconds(wait_s, "wait_s")
    targets: dict[str, list[str]] = {data_module: []}
    for target in actors:
        module, _, name = target.partition(":")
        targets.setdefault(module, []).append(name)
    with LOCK:
        _Finder.root = Path(root)
        _Finder.wait_s = wait
        _Finder.readers[data_module] = (reader, owner)
        for module, names in targets.items():
            _Finder.targets[module] = (module == data_module, tuple(names))
        if not any(isinstance(f, _Finder) for f in sys.meta_path):
            sys.meta_path.insert(0, _Finder())
        for module in targets:
            if module in sys.modules:
                _patch(sys.modules[module])


def _wait_seconds(value: Any, name: str) -> float:
    """A wait in seconds: a finite number >= 0 (from a string, as an env var gives it)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if isinstance(value, bool) or not 0 <= seconds < float("inf"):
        raise ValueError(f"{name}={value!r}: the wait for a step is seconds, a number >= 0")
    return seconds


def uninstall() -> None:
    """Undo `install`: the original functions back in the modules already imported, and
    later imports left alone."""
    with LOCK:
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]
        for name, (is_data, actors) in _Finder.targets.items():
            module = sys.modules.get(name)
            if module is None:
                continue
            if is_data:
                function = module.process_rollout_data
                module.process_rollout_data = getattr(function, ORIGINAL, function)  # type: ignore[attr-defined]
            for actor_name in actors:
                actor = getattr(module, actor_name, None)
                if actor is not None:
                    actor.train = getattr(actor.train, ORIGINAL, actor.train)
        _Finder.targets.clear()
        _Finder.readers.clear()


def _patch(module: types.ModuleType) -> None:
    is_data, actors = _Finder.targets[module.__name__]
    if is_data:
        _patch_data(module, _Finder.root, _Finder.wait_s)
    for name in actors:
        actor = getattr(module, name, None)
        if actor is not None:
            actor.train = _with_rollout_id(getattr(actor.train, ORIGINAL, actor.train))


def _patch_data(data: types.ModuleType, root: Path, wait_s: float) -> None:
    current = data.process_rollout_data
    original = getattr(current, ORIGINAL, current)
    handle_class = getattr(data, PAIR_MARKER, None)
    reader, owner = _Finder.readers[data.__name__]

    @functools.wraps(original)
    def process_rollout_data(
        args: Any, rollout_data_ref: Any, dp_rank: int, dp_size: int, *rest: Any, **kwargs: Any
    ) -> Any:
        rollout_id = _ROLLOUT_ID.get()
        if rollout_id is None:
            raise LateInstallError(
                f"{owner}.install ran after Ray loaded the training actor "
                "class, so train() is not wrapped and would train on the rollout side's "
                "batch; install it before the actor exists: pass "
                f"{owner}.runtime_env(root) as the job's runtime env "
                "(worker_process_setup_hook)"
            )
        if getattr(args, "enable_witness", False):
            raise ValueError("rollout-shards steps carry no witness ids: turn off --enable-witness")
        folder = root / f"step={rollout_id}"
        wait_for_step(folder, wait_s)
        gbs = getattr(args, "global_batch_size", None)
        data = reader(folder, dp_rank, dp_size=dp_size, global_batch_size=gbs)
        if handle_class is None:
            return data
        return data, handle_class(value=data, release_fn=_release_nothing)

    setattr(process_rollout_data, ORIGINAL, original)
    data.process_rollout_data = process_rollout_data  # type: ignore[attr-defined]


def _release_nothing(value: Any) -> None:
    """The shards' dict holds no object-store buffer to release."""


def _with_rollout_id(train: Any) -> Any:
    @functools.wraps(train)
    def wrapped(self: Any, rollout_id: int, *args: Any, **kwargs: Any) -> Any:
        token = _ROLLOUT_ID.set(int(rollout_id))
        try:
            return train(self, rollout_id, *args, **kwargs)
        finally:
            _ROLLOUT_ID.reset(token)

    setattr(wrapped, ORIGINAL, train)
    return wrapped


class _Finder(PatchingFinder):
    """Patches a trainer's modules right after they are executed, before the importer
    (Ray loading the actor class) sees them."""

    root: Path = Path(".")
    wait_s: float = WAIT_S
    targets: dict[str, tuple[bool, tuple[str, ...]]] = {}
    readers: dict[str, tuple[Reader, str]] = {}

    def __init__(self) -> None:
        super().__init__(_Finder.targets, _patch)

"""Train a miles run from rollout-shards step folders, without a fork of miles.

miles' trainer gets its rank's data in one call: `get_rollout_data(args, rollout_data_ref,
...)` in `miles/backends/training_utils/data.py` calls `process_rollout_data(args,
rollout_data_ref, dp_rank, dp_size, ...)`, a name imported into that module from
`miles/utils/data.py` and so looked up there at call time. The training actor's
`train(self, rollout_id, rollout_data_ref, ...)` knows the step.

`install(root)` wraps both: `train` sets the rollout id for the duration of the call, and
`process_rollout_data` returns `read_rank(<root>/step=<rollout_id>, dp_rank, ...)` in the
shape the installed miles expects: since miles #591 (July 2026) the pair `(rank dict,
handle)` whose handle `train()` enters as a context (`ObjectStoreGetResult`), before it
the rank dict alone.

Ray takes an actor's methods when it loads the actor class in a worker, so the wrapping
must happen before that: `runtime_env(root)` gives the Ray runtime environment whose
`worker_process_setup_hook` installs in every worker before any actor is created, and the
wrapping itself waits until miles' trainer modules are imported. A `process_rollout_data`
call outside a wrapped `train` means the install came too late (Ray kept the unwrapped
`train`): it raises instead of handing the trainer the rollout side's own batch.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import threading
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rollout_shards_loader._read import read_rank

DATA_MODULE = "miles.backends.training_utils.data"
ACTORS = (
    "miles.backends.megatron_utils.actor:MegatronTrainRayActor",
    "miles.backends.fsdp_utils.actor:FSDPTrainRayActor",
)
ROOT_ENV = "ROLLOUT_SHARDS_ROOT"
SETUP_HOOK = "rollout_shards_loader.miles.setup_hook"
ORIGINAL = "_rollout_shards_original"  # not __wrapped__: miles' own decorators set that
# miles' handle class since #591; a data module without it returns the rank dict alone.
PAIR_MARKER = "ObjectStoreGetResult"

_ROLLOUT_ID: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "rollout_shards_rollout_id", default=None
)
_LOCK = threading.Lock()


class LateInstallError(RuntimeError):
    """`process_rollout_data` ran outside a wrapped `train`: Ray loaded the actor class
    before `install`, so the trainer would train on the rollout side's batch."""


def runtime_env(
    root: str | Path, base: dict[str, Any] | None = None, *, hook: str = SETUP_HOOK
) -> dict[str, Any]:
    """The Ray runtime environment (for `ray job submit --runtime-env-json` or
    `ray.init(runtime_env=...)`) that installs the hook in every worker of the job before
    any actor exists: `base` plus `worker_process_setup_hook` and `ROLLOUT_SHARDS_ROOT`."""
    env = dict(base or {})
    if env.get("worker_process_setup_hook") not in (None, hook):
        module = hook.rpartition(".")[0]
        raise ValueError(
            "the runtime env already has a worker_process_setup_hook "
            f"({env['worker_process_setup_hook']!r}): call "
            f"{module}.install(root) from it instead"
        )
    env["worker_process_setup_hook"] = hook
    env["env_vars"] = {**env.get("env_vars", {}), ROOT_ENV: str(root)}
    return env


def setup_hook() -> None:
    """Ray's `worker_process_setup_hook`: `install($ROLLOUT_SHARDS_ROOT)`."""
    root = os.environ.get(ROOT_ENV)
    if not root:
        raise RuntimeError(
            f"{SETUP_HOOK} needs {ROOT_ENV} in the runtime env's env_vars "
            "(rollout_shards_loader.miles.runtime_env(root) sets both)"
        )
    install(root)


def install(
    root: str | Path,
    *,
    data_module: str = DATA_MODULE,
    actors: Sequence[str] = ACTORS,
    reader: Callable[..., dict[str, Any]] = read_rank,
    owner: str = __name__,
) -> None:
    """Make miles' trainer read rank data from `<root>/step=<rollout_id>/`.

    Modules already imported are patched now; the others when they are imported (nothing
    of miles is imported here). `actors` are the `module:Class` training actors whose
    `train(rollout_id, ...)` is wrapped; `data_module` the module whose
    `process_rollout_data` the trainer calls, `reader` the `read_rank` that answers it
    (`rollout_shards_loader.slime` passes its own, and its name as `owner`, the module a
    user installs from). Installing twice wraps once."""
    targets: dict[str, list[str]] = {data_module: []}
    for target in actors:
        module, _, name = target.partition(":")
        targets.setdefault(module, []).append(name)
    with _LOCK:
        _Finder.root = Path(root)
        _Finder.readers[data_module] = (reader, owner)
        for module, names in targets.items():
            _Finder.targets[module] = (module == data_module, tuple(names))
        if not any(isinstance(f, _Finder) for f in sys.meta_path):
            sys.meta_path.insert(0, _Finder())
        for module in targets:
            if module in sys.modules:
                _patch(sys.modules[module])


def uninstall() -> None:
    """Undo `install`: the original functions back in the modules already imported, and
    later imports left alone."""
    with _LOCK:
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
        _patch_data(module, _Finder.root)
    for name in actors:
        actor = getattr(module, name, None)
        if actor is not None:
            actor.train = _with_rollout_id(getattr(actor.train, ORIGINAL, actor.train))


def _patch_data(data: types.ModuleType, root: Path) -> None:
    current = data.process_rollout_data
    original = getattr(current, ORIGINAL, current)
    handle_class = getattr(data, PAIR_MARKER, None)
    reader, owner = _Finder.readers.get(data.__name__, (read_rank, __name__))

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


class _Finder(importlib.abc.MetaPathFinder):
    """Patches miles' trainer modules right after they are executed, before the importer
    (Ray loading the actor class) sees them."""

    root: Path = Path(".")
    targets: dict[str, tuple[bool, tuple[str, ...]]] = {}
    readers: dict[str, tuple[Callable[..., dict[str, Any]], str]] = {}

    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        if fullname not in self.targets:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __getattr__(self, name: str) -> Any:
        # get_source, get_code, is_package, resource readers: the real loader's
        return getattr(self.loader, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.loader.exec_module(module)
        with _LOCK:
            _patch(module)

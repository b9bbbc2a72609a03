"""A trainer's own source at a pinned commit, and its modules imported on CPU with stand-ins
for every package it needs that this environment has not (tests/support/miles.py,
slime.py; verl.py takes the stand-ins). Each trainer's module keeps its URL, PIN and
SOURCE_ENV (tests/peer_sources.py reads them there) and what its modules are."""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import inspect
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class SourceMissing(RuntimeError):
    """Neither the trainer's SOURCE_ENV nor a clone of its public repository is available."""


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rollout-shards"


def git(*args: str) -> bytes:
    done = subprocess.run(["git", *args], capture_output=True, check=False)
    if done.returncode:
        message = done.stderr.decode(errors="replace").strip().splitlines()
        raise SourceMissing(message[-1] if message else f"git {args[0]} failed")
    return done.stdout


def _made(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _published(partial: Path, out: Path, package: str) -> Path:
    """`partial` renamed to `out`, unless another process (a test worker) published `out`
    first."""
    try:
        partial.rename(out)
    except OSError:
        if not (out / package / "__init__.py").is_file():
            raise
        shutil.rmtree(partial, ignore_errors=True)
    return out


def source(package: str, url: str, pin: str, source_env: str, commit: str) -> Path:
    """A folder holding `package/` of the repository at `url` at `commit` (40 hex digits):
    from `source_env` (a folder holding the package, a checkout, or a git directory), else
    from a clone in the user's cache, else by cloning `url`; SourceMissing without one."""
    given = os.environ.get(source_env)
    if given:
        origin = Path(given)
        is_git = (origin / "HEAD").is_file() or (origin / ".git").exists()
        if not is_git and (origin / package / "__init__.py").is_file():
            if commit != pin:
                raise SourceMissing(
                    f"{source_env}={given} is a folder without git history, and this test "
                    f"needs {package} at {commit}: point {source_env} at a git checkout of {url}"
                )
            return origin
        if not is_git:
            raise SourceMissing(
                f"{source_env}={given} is neither a checkout of {url} nor its git directory"
            )
        git_dir = origin / ".git" if (origin / ".git").is_dir() else origin
        out = cache_root() / f"{package}-src-{commit}"
        if (out / package / "__init__.py").is_file():
            return out
        try:
            archive = git(f"--git-dir={git_dir}", "archive", commit, package)
        except SourceMissing as exc:
            raise SourceMissing(
                f"{source_env}={given} has no {package} commit {commit}: {exc}"
            ) from None
        partial = Path(tempfile.mkdtemp(prefix=out.name, dir=_made(out.parent)))
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(partial, filter="data")
        return _published(partial, out, package)
    out = cache_root() / f"{package}-{commit}"
    if (out / package / "__init__.py").is_file():
        return out
    # a clone of its own per process (test workers may clone at once), renamed into place
    partial = Path(tempfile.mkdtemp(prefix=out.name, dir=_made(out.parent)))
    try:
        git("clone", "-q", "--no-checkout", url, str(partial))
        git("-C", str(partial), "checkout", "-q", commit)
    except SourceMissing as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise SourceMissing(
            f"no {package} source: set {source_env} to a checkout of {url} at {commit} "
            f"(git clone {url} failed: {exc})"
        ) from None
    return _published(partial, out, package)


# --- stand-ins for third-party packages ------------------------------------------------


def _decorated(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return (
        len(args) == 1 and not kwargs and (inspect.isfunction(args[0]) or inspect.isclass(args[0]))
    )


class _StubMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return stub_class(f"{cls.__name__}.{name}")

    def __getitem__(cls, item: Any) -> Any:
        return cls

    def __iter__(cls) -> Iterator[Any]:
        return iter(())

    def __or__(cls, other: Any) -> Any:
        return cls

    def __ror__(cls, other: Any) -> Any:
        return cls


class _Stub(metaclass=_StubMeta):
    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # a decorator (`@ray.remote`, `@torch_memory_saver.x`): hand back what it decorates
        if _decorated(args, kwargs):
            return args[0]
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return stub_class(f"{type(self).__name__}.{name}")()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _decorated(args, kwargs):
            return args[0]
        return type(self)()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def __iter__(self) -> Iterator[Any]:
        return iter(())


def stub_class(name: str) -> type:
    return _StubMeta(name, (_Stub,), {})


class StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = stub_class(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class StubLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _imported_by(package: str, owner: str) -> bool:
    """Whether the import under way is one of `package`'s own (or a stand-in's), read from
    the first frame outside importlib, this module and `owner` (the trainer's support)."""
    frame = sys._getframe(3)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not name.startswith(("importlib", "_frozen_importlib")) and name not in (
            __name__,
            owner,
        ):
            return (
                name == package
                or name.startswith(f"{package}.")
                or isinstance(sys.modules.get(name), StubModule)
            )
        frame = frame.f_back
    return False


class StubFinder(importlib.abc.MetaPathFinder):
    """Stands in for every non-standard package that `package`'s modules import, but those
    in `real`; `names` collects what it stood in for."""

    def __init__(self, package: str, real: set[str], owner: str) -> None:
        self.package, self.real, self.owner = package, real, owner
        self.names: set[str] = set()

    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        top = fullname.partition(".")[0]
        if top in self.real or top in sys.stdlib_module_names:
            return None
        parent = sys.modules.get(fullname.rpartition(".")[0])
        if not (isinstance(parent, StubModule) or self._imported_by()):
            return None
        self.names.add(fullname)
        return importlib.machinery.ModuleSpec(fullname, StubLoader(), is_package=True)

    def _imported_by(self) -> bool:
        return _imported_by(self.package, self.owner)


def no_compile(model: Any = None, **options: Any) -> Any:
    return model if model is not None else (lambda function: function)


@contextlib.contextmanager
def stand_ins(package: str, real: set[str], owner: str, source: Path) -> Iterator[None]:
    """`package` importable from `source`, every other package it imports (but `real`)
    a stand-in, CUDA pointed at the CPU and torch.compile a no-op (compiling is no part of
    the data path); everything imported meanwhile is forgotten on exit."""
    import torch

    before = set(sys.modules)
    finder = StubFinder(package, real, owner)
    sys.meta_path.insert(0, finder)
    sys.path.insert(0, str(source))
    saved = (torch.cuda.current_device, torch.Tensor.cuda, torch.cuda.synchronize, torch.compile)
    torch.compile = no_compile  # type: ignore[assignment]
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.cuda.current_device, torch.Tensor.cuda, torch.cuda.synchronize, torch.compile = saved
        sys.meta_path.remove(finder)
        sys.path.remove(str(source))
        for name in set(sys.modules) - before:
            del sys.modules[name]

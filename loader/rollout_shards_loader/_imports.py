"""Patching modules the moment their import finishes, before the importer sees them."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

LOCK = threading.Lock()


class PatchingFinder(importlib.abc.MetaPathFinder):
    """Finds the modules `targets` names with the other finders and has `patch` run on
    each right after it is executed (under LOCK)."""

    def __init__(self, targets: dict[str, Any], patch: Callable[[types.ModuleType], None]):
        self.targets = targets
        self.patch = patch

    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        if fullname not in self.targets:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, self.patch)
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, patch: Callable[[types.ModuleType], None]) -> None:
        self.loader = loader
        self.patch = patch

    def __getattr__(self, name: str) -> Any:
        # get_source, get_code, is_package, resource readers: the real loader's
        return getattr(self.loader, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.loader.exec_module(module)
        with LOCK:
            self.patch(module)

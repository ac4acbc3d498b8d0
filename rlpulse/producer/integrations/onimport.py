"""Wrap a framework's functions when their modules are imported, not before: what the verl and
ROLL hooks share. A Ray setup hook runs in every process of a job, vLLM servers and reward
workers included; importing the framework's training modules there to wrap them would cost
each of those processes the import. :class:`OnImport` instead waits for the import and wraps
the module as soon as it has run, before any other module binds its functions by name.

>>> seen = []
>>> hook = OnImport(["sys"], lambda module: seen.append(module.__name__))
>>> hook.install()  # sys is already imported: called at once
>>> hook.uninstall(); seen
['sys']
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


class OnImport(importlib.abc.MetaPathFinder):
    """Calls ``then(module)`` once each of ``names`` is imported (at once for those already
    imported): a finder first on ``sys.meta_path`` that hands the import to the others and
    wraps the loader they return."""

    def __init__(self, names: Any, then: Callable[[ModuleType], None]) -> None:
        self.names = frozenset(names)
        self.then = then

    def install(self) -> None:
        for name in self.names:
            module = sys.modules.get(name)
            if module is not None:
                self.then(module)
        sys.meta_path.insert(0, self)

    def uninstall(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.names:
            return None
        # Only the finders after this one: two hooks waiting for the same module (verl's
        # phases and its engines) would otherwise hand the import to each other for ever.
        finders = sys.meta_path
        after = finders[finders.index(self) + 1 :] if self in finders else finders
        for finder in after:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _ThenLoader(spec.loader, self.then)
                return spec
        return None


class _ThenLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, then: Callable[[ModuleType], None]) -> None:
        self.loader = loader
        self.then = then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.then(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename... (tracebacks)
        return getattr(self.loader, name)

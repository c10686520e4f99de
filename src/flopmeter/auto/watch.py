"""Runs a function on a module right after Python has imported it (a post-import hook).

:func:`install` puts one finder first on ``sys.meta_path``. For a watched name it finds the
module's spec the usual way (the other finders), and wraps its loader so that, once the module
has executed, each hook ``"package.module:function"`` is imported and called with the module.
The wrapper hands the module its real loader back before executing it, so nothing afterwards
sees the wrapper. A hook that raises is logged and the import goes on. Standard library only.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.util
import logging
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from flopmeter.auto.job import problem

__all__ = ["after_init", "install", "run_hooks"]

logger = logging.getLogger("flopmeter")

#: The mark of a function wrapped here (so a second wrap is none).
WRAPPED = "__flopmeter_wrapped__"


def run_hooks(module: ModuleType, hooks: Sequence[str]) -> None:
    """Calls each ``"package.module:function"`` of ``hooks`` with ``module`` (never raises)."""
    for hook in hooks:
        try:
            where, _, name = hook.partition(":")
            getattr(importlib.import_module(where), name)(module)
        except Exception:
            logger.exception("flopmeter: zero-code hook %s failed on %s", hook, module.__name__)


class _HookedLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, hooks: Sequence[str]) -> None:
        self._loader = loader
        self._hooks = hooks

    def create_module(self, spec: Any) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        spec = getattr(module, "__spec__", None)
        if spec is not None:
            spec.loader = self._loader
        module.__loader__ = self._loader
        self._loader.exec_module(module)
        run_hooks(module, self._hooks)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self, hooks: Mapping[str, Sequence[str]]) -> None:
        self.hooks = dict(hooks)
        self._local = threading.local()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        hooks = self.hooks.get(fullname)
        busy: set[str] = getattr(self._local, "busy", set())
        if not hooks or fullname in busy:
            return None
        self._local.busy = busy | {fullname}
        try:
            spec = importlib.util.find_spec(fullname)  # the other finders (we answer None now)
        except Exception:
            return None
        finally:
            self._local.busy = busy
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _HookedLoader(spec.loader, hooks)
        return spec


def install(hooks: Mapping[str, Sequence[str]]) -> None:
    """Runs ``hooks[name]`` on module ``name`` once it is imported: now for those already
    imported, after their import for the others (once per process)."""
    if any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _PostImportFinder(hooks))
    for name, names in hooks.items():
        module = sys.modules.get(name)
        if module is not None:
            run_hooks(module, names)


def after_init(cls: type, hook: Callable[[Any], None], where: str) -> None:
    """Wraps ``cls.__init__`` (once) so that ``hook(instance)`` runs after it: for every
    subclass that calls it too (a Trainer subclass calling ``super().__init__``, every
    optimizer class). The hook's exceptions never reach the caller: each is logged and recorded
    as ``problem`` at ``where`` (:func:`flopmeter.auto.job.problem`)."""
    original = cls.__init__
    if getattr(original, WRAPPED, False):
        return

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            hook(self)
        except Exception as exc:  # never the job's problem
            problem(where, exc)

    setattr(__init__, WRAPPED, True)
    cls.__init__ = __init__  # type: ignore[misc]

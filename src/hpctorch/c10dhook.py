"""Run code in a worker as ``torch.distributed.distributed_c10d`` loads, before
``torch.distributed`` copies its names (``init_process_group``...) into its own namespace:
what a wrapper installed there replaces is what every caller, the user's script, Lightning or
DeepSpeed, then calls. Where it is loaded already (a warm standby), the hook runs at once and
what it replaced is replaced in ``torch.distributed`` too. torch itself is not imported here."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType

MODULE = "torch.distributed.distributed_c10d"
_hooks: list[Callable[[ModuleType], None]] = []


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name != MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):  # type: ignore[no-untyped-def]
            execute(module)
            for hook in _hooks:
                hook(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def after_load(hook: Callable[[ModuleType], None]) -> None:
    """``hook(module)`` once the module has loaded; hooks run in the order given, so a later
    one wraps what an earlier one installed."""
    if MODULE in sys.modules:  # loaded already (a warm standby imported torch ahead, start.standby)
        module = sys.modules[MODULE]
        before = dict(module.__dict__)
        hook(module)
        _copy_to_package(module, before)
        return
    if not _hooks:
        sys.meta_path.insert(0, _Finder())
    _hooks.append(hook)


def _copy_to_package(module: ModuleType, before: dict) -> None:
    """Once ``torch.distributed`` has copied the module's names, a wrapper installed after that is
    copied there too, where it still holds what it copied: ``dist.all_reduce`` is the wrapper."""
    package = sys.modules.get("torch.distributed")
    if package is None:
        return
    for name, value in list(module.__dict__.items()):
        old = before.get(name)
        if old is not None and value is not old and package.__dict__.get(name) is old:
            setattr(package, name, value)

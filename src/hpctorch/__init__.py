"""hpctorch: run a PyTorch distributed script unchanged under any launcher.

Importing this package imports nothing else until a name is used (``hpctorch plan``
must answer fast); it never imports torch: ``init()`` does, when called.
"""

import importlib  # no "from __future__ import annotations": that is an import too, before --stage-env's finder (listed_imports)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~10 ms)

__version__ = "0.1.0"

_WHERE = {
    "Allocation": "schedulers.allocation",
    "Context": "start.initialize",
    "HpctorchError": "errors",
    "Options": "plan.types",
    "Plan": "plan.types",
    "detect": "schedulers",
    "init": "start.initialize",
    "make_plan": "plan.decide",
}
__all__ = ["Allocation", "Context", "HpctorchError", "Options", "Plan", "detect", "init", "make_plan"]  # = sorted(_WHERE)

if TYPE_CHECKING:
    from .errors import HpctorchError
    from .plan.decide import make_plan
    from .plan.types import Options, Plan
    from .schedulers import detect
    from .schedulers.allocation import Allocation
    from .start.initialize import Context, init


def __getattr__(name: str) -> object:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'hpctorch' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value

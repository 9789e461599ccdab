"""hpctorch: run a PyTorch distributed script unchanged under any launcher.

Importing this package imports nothing else until a name is used (``hpctorch plan``
must answer fast); it never imports torch: ``init()`` does, when called.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~10 ms)

__version__ = "0.1.0"

_WHERE = {
    "Allocation": "allocation",
    "Context": "initialize",
    "HpctorchError": "errors",
    "Options": "plan",
    "Plan": "plan",
    "detect": "schedulers",
    "init": "initialize",
    "make_plan": "decide",
}
__all__ = ["Allocation", "Context", "HpctorchError", "Options", "Plan", "detect", "init", "make_plan"]  # = sorted(_WHERE)

if TYPE_CHECKING:
    from .allocation import Allocation
    from .errors import HpctorchError
    from .initialize import Context, init
    from .decide import make_plan
    from .plan import Options, Plan
    from .schedulers import detect


def __getattr__(name: str) -> object:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'hpctorch' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value

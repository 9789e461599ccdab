"""hpctorch: run a PyTorch distributed script unchanged under any launcher.

Importing this package does not import torch; ``init()`` does, when called.
"""

from __future__ import annotations

from .allocation import Allocation
from .errors import HpctorchError
from .initialize import Context, init
from .plan import Options, Plan, make_plan
from .schedulers import detect

__all__ = ["Allocation", "Context", "HpctorchError", "Options", "Plan", "detect", "init", "make_plan"]
__version__ = "0.1.0"

"""The script a command line names: a Python script, a module (-m) or, with --no-python, a command."""

from __future__ import annotations

import argparse
import os

from ..errors import HpctorchError
from . import torchrun


def check_script(args: argparse.Namespace) -> None:
    if args.module or args.script is None:
        return
    if getattr(args, "no_python", False):
        return  # looked up on PATH at exec time
    if os.path.isdir(args.script):
        package = os.path.isfile(os.path.join(args.script, "__main__.py")) or os.path.isfile(os.path.join(args.script, "__init__.py"))
        raise HpctorchError(f"{args.script!r} is a folder, not a script",
                            _as_module(args.script) if package else "give the script's path inside it")
    if not os.path.isfile(args.script):
        raise HpctorchError(f"script {args.script!r} not found", "check the path (relative to the current directory)")
    if kind := torchrun.not_python(args.script):
        fix = "add --no-python to run it as a command (as torchrun does)" if hasattr(args, "no_python") else \
            "submit writes jobs for Python scripts: write the job script yourself with 'hpctorch run --no-python'"
        raise HpctorchError(f"{args.script!r} is {kind}, not a Python script", fix)


def _as_module(folder: str) -> str:
    """How python -m would run the package ``folder``: its dotted name from the current
    directory, or from its parent folder, which the fix then names."""
    relative = os.path.relpath(os.path.abspath(folder))
    if not relative.startswith(os.pardir) and relative != os.curdir:
        return f"run the package as python -m does: -m {relative.replace(os.sep, '.')}"
    parent, name = os.path.split(os.path.abspath(folder))
    return f"run the package as python -m does, from its parent folder: cd {parent} and give -m {name} (or add {parent} to PYTHONPATH)"

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
        module = args.script.rstrip("/").replace("/", ".")
        fix = (f"run the package as python -m does: -m {module}" if os.path.isfile(os.path.join(args.script, "__main__.py"))
               or os.path.isfile(os.path.join(args.script, "__init__.py")) else "give the script's path inside it")
        raise HpctorchError(f"{args.script!r} is a folder, not a script", fix)
    if not os.path.isfile(args.script):
        raise HpctorchError(f"script {args.script!r} not found", "check the path (relative to the current directory)")
    if kind := torchrun.not_python(args.script):
        fix = "add --no-python to run it as a command (as torchrun does)" if hasattr(args, "no_python") else \
            "submit writes jobs for Python scripts: write the job script yourself with 'hpctorch run --no-python'"
        raise HpctorchError(f"{args.script!r} is {kind}, not a Python script", fix)

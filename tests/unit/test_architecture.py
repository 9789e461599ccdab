"""The layout's promises (README "Layout"): launcher knowledge stays in its module, and
modules stay small enough to read."""

from __future__ import annotations

import ast
from pathlib import Path

import hpctorch
from hpctorch.schedulers import DETECTORS, hostfile, mpi, torchelastic

PACKAGE = Path(hpctorch.__file__).parent
# The job-script writer names the schedulers it writes scripts for; nothing else may.
ALLOWED = {PACKAGE / "submit" / "jobscript.py"}


def launcher_names() -> set[str]:
    names = {m.LAUNCHER.name for m in DETECTORS if hasattr(m, "LAUNCHER")}
    names |= {launcher.name for launcher, *_ in mpi.FLAVOURS}
    names |= {torchelastic.TORCHRUN.name, torchelastic.BY_HAND.name, hostfile.LAUNCHER.name}
    return names - {"env"}  # "env" is also a plain word (report keys): checked by the test below


def test_every_launcher_module_describes_its_launcher() -> None:
    for module in DETECTORS:
        if module is mpi:
            assert mpi.FLAVOURS
        elif module is torchelastic:
            assert torchelastic.TORCHRUN and torchelastic.BY_HAND
        else:
            assert module.LAUNCHER.name, module.__name__


def test_no_module_outside_schedulers_compares_a_launcher_name() -> None:
    names = launcher_names() | {"env"}
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name == "schedulers" or path in ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                for side in (node.left, *node.comparators):
                    if isinstance(side, ast.Constant) and side.value in names:
                        found.append(f"{path.name}:{node.lineno} compares with {side.value!r}")
            elif isinstance(node, ast.Dict):
                for key in node.keys:
                    if isinstance(key, ast.Constant) and key.value in launcher_names():
                        found.append(f"{path.name}:{node.lineno} keys a table by {key.value!r}")
    assert not found, found


def test_no_module_is_over_450_lines() -> None:
    long = {p.name: n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 450}
    assert not long, long

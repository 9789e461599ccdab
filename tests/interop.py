"""Shared by the interop tests: what each framework reported about its own ranks."""

from __future__ import annotations

import importlib.util

from .conftest import ROOT, require, unprefixed

FRAMEWORKS = ("lightning", "accelerate", "deepspeed")


def example(framework: str) -> str:
    require(importlib.util.find_spec(framework) is not None,
            f"{framework} is not installed (make test installs it: see the Makefile's frameworks step)")
    return str(ROOT / "examples" / f"with_{framework}.py")


def reported(output: str, framework: str) -> list[tuple[int, int, int, int]]:
    """(global rank, local rank, world size, node rank) as the framework printed them, by rank."""
    rows = []
    for line in unprefixed(output).splitlines():
        if line.startswith(f"FRAMEWORK {framework} "):
            rank, local, world, node = (int(v) for v in line.split()[2:6])
            rows.append((rank, local, world, node))
    return sorted(rows)

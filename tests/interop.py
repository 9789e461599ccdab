"""Shared by the interop tests: what each framework reported about its own ranks."""

from __future__ import annotations

import importlib.util

from .conftest import ROOT, require, unprefixed

FRAMEWORKS = ("lightning", "accelerate", "deepspeed")
JOB_LIMIT_S = 600
"""A hang guard for one framework job: DeepSpeed's first job compiles its CPU op (scripts/run-tests
builds it beside the tests, and a job started meanwhile waits on torch's build lock): 5.6 minutes
of a loaded machine once, where the job itself takes seconds."""


def example(framework: str) -> str:
    require(importlib.util.find_spec(framework) is not None,
            f"{framework} is not installed (make test installs it: see the Makefile's frameworks step)")
    return str(ROOT / "examples" / f"with_{framework}.py")


def reported(output: str, framework: str) -> list[tuple[int, int, int, int | None]]:
    """(global rank, local rank, world size, node rank) as the framework itself computed them,
    by rank; node rank None where the framework has none (Accelerate, DeepSpeed)."""
    rows = []
    for line in unprefixed(output).splitlines():
        if line.startswith(f"FRAMEWORK {framework} "):
            rank, local, world, node = line.split()[2:6]
            rows.append((int(rank), int(local), int(world), None if node == "-" else int(node)))
    return sorted(rows)


def hosts(output: str, framework: str) -> dict[int, str]:
    """Global rank -> the host its process ran on (the OS's name, not hpctorch's)."""
    found = {}
    for line in unprefixed(output).splitlines():
        if line.startswith(f"FRAMEWORK {framework} "):
            words = line.split()
            found[int(words[2])] = words[6]
    return found


def expected(framework: str, layout: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int | None]]:
    """``layout`` with the node rank only for the frameworks that compute one."""
    return [(r, lr, w, n if framework == "lightning" else None) for r, lr, w, n in layout]

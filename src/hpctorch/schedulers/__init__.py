"""Scheduler detection: an ordered registry, first match wins.

Each module reads an environment mapping and returns an ``Allocation`` or None,
with no side effects. The order encodes precedence (shared/DESIGN.md): a
launcher that set torch's variables wins over everything, an MPI launched
inside a batch job wins over the job's own variables, ``local`` always matches.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from ..allocation import Allocation
from . import local, mpi, slurm, torchelastic

Detector = Callable[[Mapping[str, str]], "Allocation | None"]

DETECTORS: tuple[tuple[str, Detector], ...] = (
    ("torchelastic", torchelastic.detect),
    ("mpi", mpi.detect),
    ("slurm", slurm.detect),
    ("local", local.detect),
)


def detect(env: Mapping[str, str] | None = None) -> Allocation:
    """The allocation described by ``env`` (default: this process's environment)."""
    env = os.environ if env is None else env
    for _, detector in DETECTORS:
        allocation = detector(env)
        if allocation is not None:
            return allocation
    raise AssertionError("the local detector always matches")

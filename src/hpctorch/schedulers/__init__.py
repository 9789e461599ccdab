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
from . import flux, k8s, local, lsf, mpi, pbs, sge, slurm, torchelastic

Detector = Callable[[Mapping[str, str]], "Allocation | None"]

DETECTORS: tuple[tuple[str, Detector], ...] = (
    ("k8s", k8s.detect),  # before torchelastic: there RANK is the pod's (node's) index
    ("torchelastic", torchelastic.detect),
    ("flux", flux.detect),  # before mpi: flux run also sets PMI_RANK
    ("mpi", mpi.detect),  # mpirun inside any batch job wins over the job's variables
    ("slurm", slurm.detect),
    ("lsf", lsf.detect),
    ("pbs", pbs.detect),
    ("sge", sge.detect),
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

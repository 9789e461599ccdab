"""Stage 1, detect: what the launcher granted (``allocation.Allocation``) and how it behaves
(``Launcher``), one module per launcher; ``hostlist`` (Slurm's host list syntax) and
``job_port`` (a port every node derives from the job id) beside them.

Detection is an ordered registry of modules, first match wins.

Each module reads an environment mapping and returns an ``Allocation`` (or None), with
no side effects, and describes its launcher's behaviours in a ``Launcher``. The order
encodes precedence (shared/DESIGN.md): a launcher that set torch's variables wins over
everything, an MPI launched inside a batch job wins over the job's own variables,
``local`` always matches. ``hostfile`` is not here: it reads a file the user names.

May import: the package root's modules (``errors``). Never torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from . import flux, k8s, local, lsf, mpi, pbs, sge, slurm, torchelastic
from .allocation import Allocation, Launched

DETECTORS = (
    k8s,  # before torchelastic: there RANK is the pod's (node's) index
    torchelastic,
    flux,  # before mpi: flux run also sets PMI_RANK
    mpi,  # mpirun inside any batch job wins over the job's variables
    slurm,
    lsf,
    pbs,
    sge,
    local,
)


def detect(env: Mapping[str, str] | None = None) -> Allocation:
    """The allocation described by ``env`` (default: this process's environment)."""
    env = os.environ if env is None else env
    for module in DETECTORS:
        if module is torchelastic and torchelastic.set_by_hand(env):
            # A wrapper or container hook (enroot's PyTorch hook) may have copied the
            # scheduler's own variables into RANK, WORLD_SIZE...: then they say nothing new.
            beneath = _scheduler_beneath(env)
            if beneath is not None:
                return torchelastic.mirrored(beneath, env)
        allocation = module.detect(env)
        if allocation is not None:
            return allocation
    raise AssertionError("the local detector always matches")


def _scheduler_beneath(env: Mapping[str, str]) -> Allocation | None:
    """The launcher that started this task, read past torch's variables: one that numbers
    its tasks (a job step), else None."""
    for module in DETECTORS[DETECTORS.index(torchelastic) + 1 :]:
        if module is local:
            return None
        allocation = module.detect(env)
        if allocation is not None:
            return allocation if allocation.task_rank is not None and allocation.launched is not Launched.BATCH else None
    return None


def this_machine(env: Mapping[str, str]) -> Allocation:
    """This machine alone, whatever launched it (torchrun's --standalone)."""
    return local.detect(env)

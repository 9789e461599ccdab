"""``hpctorch.init()``: the process group from inside a training script."""

from __future__ import annotations

import datetime
import os
import signal
import threading
from dataclasses import dataclass
from typing import Any

from ..host.signals import PREEMPT_SIGNALS
from ..plan.types import DEFAULT_RDZV_TIMEOUT_S

TORCH_CONTRACT = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
# The first signal received, kept by the handler in a list and not a threading.Event, whose set()
# takes a lock that a second signal arriving inside the first handler would wait on forever
# (Slurm signals every process of the step and hpctorch forwards it: two notices at once).
_PREEMPTED: list[int] = []


def _watch_preemption() -> None:
    """Flag SIGUSR1/SIGUSR2 instead of dying of them, unless the script handles them."""
    for sig in PREEMPT_SIGNALS:
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, lambda signum, _frame: _PREEMPTED or _PREEMPTED.append(signum))


@dataclass(frozen=True)
class Context:
    """Where this process stands in the job, once the process group is up."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    backend: str
    device: Any  # torch.device; typed loosely so this module imports without torch

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def preempted(self) -> bool:
        """True once SIGUSR1 or SIGUSR2 arrived (a scheduler's warning before the end);
        cheap enough to poll every step, then checkpoint and exit."""
        return bool(_PREEMPTED)

    def close(self) -> None:
        """Leave the process group together with every other rank.

        The barrier matters in per-task mode, where rank 0's process holds the
        rendezvous store: a rank still tearing down when rank 0 exits can abort
        ("terminate called without an active exception", seen 1 run in 10 here).
        """
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


def prepare_env() -> dict[str, str]:
    """Set torch's variables for this process from the detected allocation, if missing;
    returns what was set."""
    if all(os.environ.get(k) for k in TORCH_CONTRACT):
        return {}
    from ..plan.discover import plan_here
    from ..plan.types import Options

    plan = plan_here(Options(mode="per-task"), os.environ)
    added = {k: v for k, v in plan.workers[0].env.items() if k not in os.environ}
    os.environ.update(plan.workers[0].env)
    return added


def _apply_binding(added: dict[str, str]) -> None:
    """What the plan claims for this process, applied here (the script is already running,
    so environment variables alone would come too late): its CPUs and its thread count."""
    from ..host.cpulist import bind_to

    bind_to(added.get("HPCTORCH_CPUS", ""))
    if added.get("OMP_NUM_THREADS"):
        import torch

        torch.set_num_threads(int(added["OMP_NUM_THREADS"]))


def init(backend: str | None = None, timeout_s: float = DEFAULT_RDZV_TIMEOUT_S) -> Context:
    """Detect the job, set the environment, and call ``init_process_group``.

    Works under ``hpctorch run``, under torchrun, under a scheduler that started
    every rank (srun, mpirun), and as plain ``python script.py`` (a world of one).
    The backend is nccl when CUDA is available, else gloo.
    """
    _apply_binding(prepare_env())
    if threading.current_thread() is threading.main_thread():
        _watch_preemption()
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    node_rank = int(os.environ.get("GROUP_RANK", rank // max(1, local_world_size)))
    if torch.cuda.is_available():
        # hpctorch names each worker's devices; otherwise LOCAL_RANK, as torchrun scripts do.
        first = os.environ.get("HPCTORCH_DEVICES", "").split(",")[0]
        index = int(first) if first.isdigit() else local_rank
        device = torch.device("cuda", index % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    if not dist.is_initialized():
        from .storewait import wait_once

        unreachable = wait_once(os.environ, timeout_s, rank, world_size)  # torch's retry sleeps 0.25-0.75 s
        if unreachable:
            raise dist.DistNetworkError(unreachable)
        dist.init_process_group(
            backend=backend,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=device if device.type == "cuda" else None,
        )
    return Context(rank, local_rank, world_size, local_world_size, node_rank, backend, device)

"""The classic toy DDP job (Linear 10->10, ReLU, Linear 10->5, MSE, SGD), as a short loop.

A plain torch script: it reads torch's env:// variables, so it runs unchanged under
hpctorch run, torchrun, or (with --init hpctorch) under srun/mpirun via hpctorch.init().
Every rank prints one 'rank=...' line; rank 0 prints the loss of every step.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net2(self.relu(self.net1(x)))


def say(line: str) -> None:
    # One write per line, so lines of ranks sharing a terminal never interleave.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def setup(how: str, gpus_per_proc: int) -> tuple[int, int, list[int] | None, torch.device]:
    """Process group up; returns rank, world size, DDP device_ids and the input device."""
    if how == "hpctorch":
        import hpctorch

        ctx = hpctorch.init()
        rank, world, local_rank = ctx.rank, ctx.world_size, ctx.local_rank
    else:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
        rank, world = dist.get_rank(), dist.get_world_size()
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if not torch.cuda.is_available():
        return rank, world, None, torch.device("cpu")
    # Several GPUs per process: local rank r owns devices [r*k, (r+1)*k).
    device_ids = list(range(local_rank * gpus_per_proc, (local_rank + 1) * gpus_per_proc))
    torch.cuda.set_device(device_ids[0])
    return rank, world, device_ids, torch.device("cuda", device_ids[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--gpus-per-proc", type=int, default=1)
    parser.add_argument("--init", choices=("env", "hpctorch"), default="env")
    args = parser.parse_args()

    rank, world, device_ids, device = setup(args.init, args.gpus_per_proc)
    node = os.environ.get("GROUP_RANK", "?")
    say(
        f"rank={rank} world={world} local_rank={os.environ.get('LOCAL_RANK')} node_rank={node} "
        f"host={socket.gethostname()} master={os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} "
        f"backend={dist.get_backend()} agent={'torch' if os.environ.get('TORCHELASTIC_USE_AGENT_STORE') == 'True' else 'none'} "
        f"gpus={os.environ.get('CUDA_VISIBLE_DEVICES') or '-'}"
    )

    torch.manual_seed(0)  # same initial weights everywhere; DDP also broadcasts rank 0's
    model = ToyModel().to(device)
    ddp_model = DDP(model, device_ids=device_ids)
    loss_fn = nn.MSELoss()
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=args.lr)

    # A fixed regression problem; each rank trains on its own shard of it.
    data = torch.Generator().manual_seed(1234)
    inputs = torch.randn(64 * world, 10, generator=data)
    targets = inputs @ torch.randn(10, 5, generator=data)
    shard = slice(rank * 64, (rank + 1) * 64)
    x, y = inputs[shard].to(device), targets[shard].to(device)

    for step in range(args.steps):
        optimizer.zero_grad()
        loss = loss_fn(ddp_model(x), y)
        loss.backward()
        optimizer.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean /= world
        if rank == 0:
            say(f"step {step} loss {mean.item():.6f}")
    if rank == 0:
        say(f"done world={world} steps={args.steps}")
    # Leave together: in per-task mode rank 0's process holds the rendezvous store,
    # and a rank still tearing down when it exits can abort.
    dist.barrier()
    dist.destroy_process_group()
    leave()


def leave(code: int = 0) -> None:
    """Exit without the interpreter's teardown of torch's C++ objects.

    With torch 2.13 and gloo, about one process in ten to twenty on a loaded machine
    aborted at exit ("terminate called without an active exception"), after
    destroy_process_group had returned; os._exit skips that teardown.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()

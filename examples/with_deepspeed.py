"""DeepSpeed, written as for the deepspeed launcher or torchrun; under hpctorch run it
trains unchanged (deepspeed.init_distributed finds RANK/WORLD_SIZE/MASTER_ADDR set and
skips its own MPI discovery). On CPU the backend is gloo.

    hpctorch run --simulate-nodes 2 --nproc-per-node 2 examples/with_deepspeed.py
"""

import os
import socket
import sys

import deepspeed
import torch


def main() -> None:
    deepspeed.init_distributed(dist_backend="gloo")
    world = deepspeed.comm.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    config = {"train_batch_size": 8 * world, "train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 0}}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    for _ in range(3):
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
    deepspeed.comm.barrier()
    # What DeepSpeed's comm itself reports; it has no node index ("-"), the host is the OS's.
    # One write per line: with python -u, print() writes the newline separately and
    # lines from ranks sharing one pipe (mpirun, srun) could run together.
    sys.stdout.write(f"FRAMEWORK deepspeed {deepspeed.comm.get_rank()} {deepspeed.comm.get_local_rank()} {world} - "
                     f"{socket.gethostname()} "
                     f"{torch.distributed.get_backend()} loss={loss.item():.4f}\n")
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # skip torch's exit-time teardown (see toy_ddp.py)


if __name__ == "__main__":
    main()

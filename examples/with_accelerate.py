"""Hugging Face Accelerate, written as for `accelerate launch` or torchrun; under hpctorch
run it trains unchanged (Accelerate reads RANK/WORLD_SIZE/LOCAL_RANK from the environment).

    hpctorch run --simulate-nodes 2 --nproc-per-node 2 examples/with_accelerate.py
"""

import os
import socket
import sys

import torch
from accelerate import Accelerator


def main() -> None:
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
    accelerator.wait_for_everyone()
    state = accelerator.state
    # What Accelerate itself computed; it has no node index ("-"), the host is the OS's.
    # One write per line: with python -u, print() writes the newline separately and
    # lines from ranks sharing one pipe (mpirun, srun) could run together.
    sys.stdout.write(f"FRAMEWORK accelerate {state.process_index} {state.local_process_index} {state.num_processes} - "
                     f"{socket.gethostname()} "
                     f"{state.distributed_type} loss={loss.item():.4f}\n")
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # skip torch's exit-time teardown (see toy_ddp.py)


if __name__ == "__main__":
    main()

"""Lightning Fabric, written as for torchrun: under hpctorch run it trains unchanged.

    hpctorch run --simulate-nodes 2 --nproc-per-node 2 examples/with_lightning.py

Fabric takes torchrun's environment (hpctorch exports TORCHELASTIC_RUN_ID in every mode,
so Lightning's own SLURMEnvironment does not take over inside an srun step).
"""

import os
import socket
import sys

import lightning as L
import torch


def main() -> None:
    fabric = L.Fabric(accelerator="cpu", strategy="ddp", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                      num_nodes=int(os.environ.get("GROUP_WORLD_SIZE", "1")))
    fabric.launch()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = fabric.setup(model, optimizer)
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    for _ in range(3):
        loss = torch.nn.functional.mse_loss(model(x[fabric.global_rank :: fabric.world_size]), y[fabric.global_rank :: fabric.world_size])
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()
    fabric.barrier()
    # One write per line: with python -u, print() writes the newline separately and
    # lines from ranks sharing one pipe (mpirun, srun) could run together.
    sys.stdout.write(f"FRAMEWORK lightning {fabric.global_rank} {fabric.local_rank} {fabric.world_size} {fabric.node_rank} {socket.gethostname()} "
                     f"{type(fabric._connector.cluster_environment).__name__} loss={loss.item():.4f}\n")
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # skip torch's exit-time teardown (see toy_ddp.py)


if __name__ == "__main__":
    main()

"""The straggler watch's cost, inside one job: DDP steps, then many small collectives, timed by
rank 0 (``straggler_overhead`` runs it with the watch on and off)."""

import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

device = os.environ.get("BENCH_DEVICE", "cpu")
if device == "cuda":
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
dist.init_process_group("nccl" if device == "cuda" else "gloo")
width, steps, small = int(os.environ.get("BENCH_WIDTH", "512")), int(os.environ.get("BENCH_STEPS", "60")), int(os.environ.get("BENCH_SMALL", "500"))
model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(8)]).to(device)
ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=float(os.environ.get("BENCH_BUCKET_MB", "1")))  # several buckets a step
optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-4)
batch = torch.randn(int(os.environ.get("BENCH_BATCH", "64")), width, device=device)


def sync() -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def step() -> float:
    started = time.perf_counter()
    ddp(batch).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    sync()
    return time.perf_counter() - started


for _ in range(10):
    step()
times = [step() for _ in range(steps)]
one = torch.ones(1, device=device)
for _ in range(20):
    dist.all_reduce(one)
sync()
started = time.perf_counter()
for _ in range(small):
    dist.all_reduce(one)
sync()
per_collective = (time.perf_counter() - started) / small
if dist.get_rank() == 0:
    print("BENCH " + json.dumps({"step_s": statistics.median(times), "collective_s": per_collective}), flush=True)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)

"""The smallest distributed job: join, one all_reduce, leave. What "time to first collective" times."""

import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.ones(1)
dist.all_reduce(value)
assert int(value.item()) == dist.get_world_size(), value
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # skip torch's exit-time teardown (see examples/toy_ddp.py)

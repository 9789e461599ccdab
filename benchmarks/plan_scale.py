"""Benchmark 3: Allocation + Plan for synthetic Slurm allocations of 16 to 16,384 nodes
(hostlist nid[00001-N], heterogeneous tasks per node): time and peak memory per call,
in this process. Must grow no worse than linearly in the node count."""

from __future__ import annotations

import argparse
import gc
import ipaddress
import time
import tracemalloc
from collections.abc import Sequence

from hpctorch import Options, make_plan
from hpctorch.host import network
from hpctorch.host.facts import HostFacts
from hpctorch.schedulers import detect

from .common import save, table

FACTS = HostFacts(
    hostname="nid00002",
    interfaces=(network.Interface("hsn0", (ipaddress.IPv4Interface("10.100.0.2/16"),)),
                network.Interface("lo", (ipaddress.IPv4Interface("127.0.0.1/8"),))),
    env={}, cpus=64, pid=1, spare_port=29999, resolved={"nid00001": ("10.100.0.1",)},
)


def slurm_env(nodes: int) -> dict[str, str]:
    """srun started every rank (per-task mode); 4 tasks on the first half of the nodes,
    2 on the rest; this is task 5, local task 1 of node 1."""
    half = nodes // 2
    tasks = 4 * half + 2 * (nodes - half)
    layout = f"4(x{half}),2(x{nodes - half})"
    hosts = f"nid[00001-{nodes:05d}]"
    return {
        "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": hosts, "SLURM_STEP_NODELIST": hosts,
        "SLURM_NNODES": str(nodes), "SLURM_STEP_NUM_NODES": str(nodes), "SLURM_NTASKS": str(tasks),
        "SLURM_STEP_NUM_TASKS": str(tasks), "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
        "SLURM_STEP_TASKS_PER_NODE": layout, "SLURM_TASKS_PER_NODE": layout, "SLURMD_NODENAME": "nid00002",
    }


def one_call(nodes: int) -> tuple[float, int, int]:
    env = slurm_env(nodes)
    gc.collect()
    tracemalloc.start()
    started = time.perf_counter()
    plan = make_plan(detect(env), Options(command=("train.py",)), FACTS)
    elapsed = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert plan.nnodes == nodes and plan.node_rank == 1, (plan.nnodes, plan.node_rank)
    return elapsed, peak, plan.world_size


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    sizes = [16, 64] if args.smoke else [16, 64, 256, 1024, 4096, 16384]
    repeats = 1 if args.smoke else args.repeats
    rows, data = [], []
    for nodes in sizes:
        runs = [one_call(nodes) for _ in range(repeats)]
        # tracemalloc slows Python down; time again without it for the time column.
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            make_plan(detect(slurm_env(nodes)), Options(command=("train.py",)), FACTS)
            times.append(time.perf_counter() - started)
        best = min(times)
        peak = max(r[1] for r in runs)
        data.append({"nodes": nodes, "seconds": best, "peak_bytes": peak, "world_size": runs[0][2]})
        rows.append([nodes, runs[0][2], f"{best * 1e3:.2f}", f"{best / nodes * 1e6:.2f}", f"{peak / 2**20:.2f}", f"{peak / nodes:.0f}"])
    print(table(["nodes", "world size", "time ms (best)", "us per node", "peak MiB", "bytes per node"], rows))
    first, last = data[0], data[-1]
    growth = (last["seconds"] / first["seconds"]) / (last["nodes"] / first["nodes"])
    print(f"\ntime growth vs node growth, {first['nodes']} -> {last['nodes']} nodes: {growth:.2f} (1 = linear, < 1 better)")
    if not args.smoke:
        save("plan_scale", {"sizes": data, "growth_vs_linear": growth})


if __name__ == "__main__":
    main()

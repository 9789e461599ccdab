"""Benchmark 12: the time a restart loses. 2 nodes x 2 ranks (the namespace cluster when root,
else simulated nodes on loopback), ``--max-restarts 1``; each step is a DDP-like all_reduce and
0.1 s of compute, and rank 3 is SIGKILLed at step 25 of the first attempt. Lost time: the first
step after the restart minus the last step before, on rank 0's clock. hpctorch (warm standbys,
the default; and without them, ``HPCTORCH_STANDBY=0``) against torchrun with the same c10d
rendezvous typed by hand, interleaved; and each case's CPU (standbys forked from a zygote, or each
started as its own process with ``HPCTORCH_STANDBY=spawn``).

    python -m benchmarks.restart [--repeats 3] [--no-cluster] [--smoke]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from hpctorch.host.network import free_port

from .common import PYTHON, clean_env, interleaved, kill_trees, save, summary, table, work_and_cluster

STEPS = """
import os, signal, sys, time
import torch, torch.distributed as dist
steps_file, die_at, after = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
died = steps_file + ".died"
# The attempt by the killed rank's mark, not TORCHELASTIC_RESTART_COUNT: that is each node's own
# count, and a node restarted by its peer's failure keeps its 0.
attempt = 1 if os.path.exists(died) else 0
dist.init_process_group("gloo")
grad = torch.ones(1 << 16)
for step in range(die_at + 10 if attempt == 0 else after):
    dist.all_reduce(grad)
    time.sleep(0.1)  # the step's compute
    if dist.get_rank() == 0:
        with open(steps_file, "a") as out:
            out.write(f"{attempt} {step} {time.time():.6f}\\n")
    if attempt == 0 and step == die_at and dist.get_rank() == 3:
        open(died, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
dist.destroy_process_group()
"""


TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
"""torch's own opt-out, which hpctorch sets for its restarts too: with the store shared across
rounds, restarted workers read the dead ones' addresses and the restart fails
(pytorch/pytorch#135712; it did here, 0 steps after the restart)."""


TORCHRUN, DEFAULT = "torchrun, c10d by hand", "hpctorch run (warm standbys)"
"""The baseline row and hpctorch's default, the two a smoke run keeps."""


def lost(commands: Sequence[Sequence[str]], steps: Path, env: dict[str, str]) -> float:
    """Run the nodes to their end; seconds between the last step before the restart and the first after."""
    steps.unlink(missing_ok=True)
    steps.with_name(steps.name + ".died").unlink(missing_ok=True)
    logs = [steps.with_name(f"node{n}.log") for n in range(len(commands))]
    processes = [subprocess.Popen(list(c), stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
                 for c, log in zip(commands, logs)]
    deadline = time.monotonic() + 300
    try:
        for process in processes:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        kill_trees(processes)
        raise RuntimeError("the job did not end within 300 s; node 0 said:\n" + logs[0].read_text(errors="replace")[-3000:]) from None
    marks = [line.split() for line in steps.read_text().splitlines()] if steps.exists() else []
    before = [float(t) for attempt, _step, t in marks if attempt == "0"]
    after = [float(t) for attempt, _step, t in marks if attempt == "1"]
    if not before or not after:
        raise RuntimeError(f"the job did not restart and train again ({len(before)} steps before, {len(after)} after); node 0 said:\n"
                           + logs[0].read_text(errors="replace")[-3000:])
    return min(after) - max(before)


def cases(work: Path, cluster=None, die_at: int = 25, after: int = 5) -> dict[str, Callable[[], float]]:  # type: ignore[no-untyped-def]
    script = work / "steps.py"
    script.write_text(STEPS)
    steps = work / "steps.txt"
    args = [str(script), str(steps), str(die_at), str(after)]
    if cluster is None:
        env = clean_env()

        def torchrun() -> float:
            endpoint = f"127.0.0.1:{free_port('')}"
            run_id = f"bench{time.time_ns()}"
            # Both agents on one host: which one serves the store is typed by hand too.
            return lost([[PYTHON, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2", "--max-restarts", "1",
                          "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", run_id, "--rdzv-conf", f"is_host={host}", *args]
                         for host in ("true", "false")], steps, {**env, **TORCHRUN_ENV})

        def hpctorch(standby: str) -> Callable[[], float]:
            return lambda: lost([[PYTHON, "-m", "hpctorch", "run", "--simulate-nodes", "2", "--nproc-per-node", "2", "--max-restarts", "1",
                                  *args]], steps, {**env, "HPCTORCH_STANDBY": standby})
    else:
        from tests.cluster.harness import fabric_addr

        hosts = work / "hosts"
        hosts.write_text("".join(f"{fabric_addr(i)} slots=2\n" for i in (1, 2)))
        env = cluster.env()

        def torchrun() -> float:
            endpoint = f"{fabric_addr(1)}:{free_port('')}"
            # GLOO_SOCKET_IFNAME hand-given too: without it gloo takes the management network and hangs.
            run_id = f"bench{time.time_ns()}"
            # is_host and each node's address by hand as well: torch finds itself the host, and tells
            # the workers the master, by its host name, which no resolver here gives an address.
            return lost([cluster.on(node, [PYTHON, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2", "--max-restarts",
                                           "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", run_id,
                                           "--rdzv-conf", f"is_host={'true' if index == 0 else 'false'}",
                                           "--local-addr", fabric_addr(index + 1), *args])
                         for index, node in enumerate(cluster.names)], steps, cluster.env(GLOO_SOCKET_IFNAME="hsn0", **TORCHRUN_ENV))

        def hpctorch(standby: str) -> Callable[[], float]:
            return lambda: lost([cluster.on(node, [PYTHON, "-m", "hpctorch", "run", "--hostfile", str(hosts), "--max-restarts", "1", *args])
                                 for node in cluster.names], steps, {**env, "HPCTORCH_STANDBY": standby})

    return {TORCHRUN: torchrun, DEFAULT: hpctorch("1"),
            "hpctorch run, HPCTORCH_STANDBY=spawn": hpctorch("spawn"), "hpctorch run, HPCTORCH_STANDBY=0": hpctorch("0")}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="one run of torchrun and of the default, simulated, the rank killed at step 5")
    parser.add_argument("--no-cluster", action="store_true")
    args = parser.parse_args(argv)
    with work_and_cluster("restart", not args.smoke and not args.no_cluster) as (work, cluster):
        timed = cases(work, cluster, die_at=5 if args.smoke else 25)
        if args.smoke:
            # The baseline and hpctorch's default: the other two rows are the same code with another
            # HPCTORCH_STANDBY (their restarts are tests/integration/test_standby.py's), ~25 s of CPU each.
            timed = {name: case for name, case in timed.items() if name in (TORCHRUN, DEFAULT)}
        spent: dict[str, list[float]] = {name: [] for name in timed}
        times = interleaved({name: with_cpu(case, spent[name]) for name, case in timed.items()}, 1 if args.smoke else args.repeats)
    where = "2 network namespaces (the test cluster)" if cluster is not None else "2 simulated nodes on loopback"
    base = summary(times[TORCHRUN])["median"]
    print(f"{where}; rank 3 SIGKILLed at step {5 if args.smoke else 25}; time lost = first step after - last step before (rank 0); "
          "CPU: every process of the job, both nodes, start to end (standbys included)")
    print(table(["command", "median s", "min / max s", "of torchrun's", "CPU s (median)"],
                [[n, f"{summary(v)['median']:.2f}", f"{summary(v)['min']:.2f} / {summary(v)['max']:.2f}",
                  f"{summary(v)['median'] / base:.2f}x", f"{summary(spent[n])['median']:.1f}"] for n, v in times.items()]))
    if not args.smoke:
        save("restart", {"where": where, "times": times, "cpu_s": spent})


def with_cpu(case: Callable[[], float], spent: list[float]) -> Callable[[], float]:
    """``case``, noting the CPU time of the processes it ran (each reaped by its parent, up to ours)."""
    def run() -> float:
        before = _children_cpu()
        value = case()
        spent.append(_children_cpu() - before)
        return value
    return run


def _children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


if __name__ == "__main__":
    main()

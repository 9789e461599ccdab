"""Benchmark 6: one worker on node 2 is killed (SIGKILL) during a long compute phase
with no collective; time from its death to the exit of the job's last process.
hpctorch vs torchrun, 2 nodes x 2 (the namespace cluster when root, else simulated
nodes on loopback), interleaved."""

from __future__ import annotations

import argparse
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from hpctorch.host.network import free_port

from .common import PYTHON, ROOT, clean_env, interleaved, kill_trees, save, summary, table, work_and_cluster

COMPUTE = str(ROOT / "tests" / "fixtures" / "compute.py")


def after_death(commands: Sequence[Sequence[str]], marker: Path, env: dict[str, str]) -> float:
    """Start the nodes, wait for all to exit; seconds from the death marker to the last exit."""
    marker.unlink(missing_ok=True)
    processes = [subprocess.Popen(list(c), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
                 for c in commands]
    deadline = time.monotonic() + 300
    try:
        for process in processes:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        kill_trees(processes)
        raise
    ended = time.time()
    if not marker.exists():
        raise RuntimeError("the worker meant to die never did (did the job start?)")
    return ended - float(marker.read_text())


def cases(seconds: float, work: Path, cluster=None) -> dict[str, Callable[[], float]]:  # type: ignore[no-untyped-def]
    marker = work / "died"
    script = [COMPUTE, "--seconds", str(seconds), "--die-rank", "3", "--death-marker", str(marker)]
    if cluster is None:
        env = clean_env()

        def torchrun() -> float:
            port = str(free_port(""))
            return after_death([[PYTHON, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(r), "--master-addr", "127.0.0.1",
                                 "--master-port", port, "--nproc-per-node", "2", *script] for r in (0, 1)], marker, env)

        return {
            "torchrun x 2 agents": torchrun,
            "hpctorch run --simulate-nodes 2": lambda: after_death(
                [[PYTHON, "-m", "hpctorch", "run", "--simulate-nodes", "2", "--nproc-per-node", "2", *script]], marker, env),
        }
    from tests.cluster.harness import fabric_addr

    hosts = work / "hosts"
    hosts.write_text("".join(f"{fabric_addr(i)} slots=2\n" for i in (1, 2)))
    env = cluster.env()

    def torchrun_on_nodes() -> float:
        port = str(free_port(""))
        # GLOO_SOCKET_IFNAME hand-given too: without it gloo takes the management network and hangs.
        return after_death([cluster.on(node, [PYTHON, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(r),
                                              "--master-addr", fabric_addr(1), "--master-port", port, "--nproc-per-node", "2", *script])
                            for r, node in enumerate(cluster.names)], marker, cluster.env(GLOO_SOCKET_IFNAME="hsn0"))

    return {
        "torchrun on each node": torchrun_on_nodes,
        "hpctorch run --hostfile on each node": lambda: after_death(
            [cluster.on(node, [PYTHON, "-m", "hpctorch", "run", "--hostfile", str(hosts), *script]) for node in cluster.names], marker, env),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=30, help="length of the compute phase")
    parser.add_argument("--smoke", action="store_true", help="one run each, simulated, a 4 s compute phase")
    parser.add_argument("--no-cluster", action="store_true")
    args = parser.parse_args(argv)
    repeats, seconds = (1, 4.0) if args.smoke else (args.repeats, args.seconds)
    with work_and_cluster("teardown", not args.smoke and not args.no_cluster) as (work, cluster):
        times = interleaved(cases(seconds, work, cluster), repeats)
    where = "2 network namespaces (the test cluster)" if cluster is not None else "2 simulated nodes on loopback"
    print(f"{where}; compute phase {seconds:.0f} s; the rank dies 2 s into it")
    print(table(["command", "median s", "min / max s"],
                [[n, f"{summary(v)['median']:.2f}", f"{summary(v)['min']:.2f} / {summary(v)['max']:.2f}"] for n, v in times.items()]))
    if not args.smoke:
        save("teardown", {"where": where, "compute_seconds": seconds, "times": times})


if __name__ == "__main__":
    main()

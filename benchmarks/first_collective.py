"""Benchmark 1: time from the command to every rank past init_process_group, one
all_reduce and exit: torchrun with hand-given arguments vs hpctorch per node vs
hpctorch per task (every rank started by mpirun or srun).

1 node x 2 on this machine; 2 nodes x 2 on the namespace cluster of the tests when
root (hostfile mode and srun), else two simulated nodes on loopback.
Runs are interleaved (A B C A B C ...).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from hpctorch.host.network import free_port

from .common import PYTHON, WORKER, clean_env, cluster_available, interleaved, kill_trees, save, summary, table

HPCTORCH = (PYTHON, "-m", "hpctorch", "run")
TORCHRUN = (PYTHON, "-m", "torch.distributed.run")
MPIRUN = ("mpirun", "--oversubscribe", "--allow-run-as-root", "-x", "PATH")


def together(commands: Sequence[Sequence[str]], env: dict[str, str] | None = None, timeout: float = 300) -> float:
    """Start every command at once; seconds until the last exits. Any failure aborts."""
    started = time.perf_counter()
    processes = [subprocess.Popen(list(c), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env or clean_env(),
                                  start_new_session=True) for c in commands]
    try:
        errors = [(p.args, p.communicate(timeout=max(0.1, timeout - (time.perf_counter() - started)))[1]) for p in processes]
    except subprocess.TimeoutExpired:
        kill_trees(processes)
        raise
    elapsed = time.perf_counter() - started
    failed = [(args, err[-800:]) for (args, err), p in zip(errors, processes) if p.returncode != 0]
    if failed:
        raise RuntimeError(f"benchmark command failed: {failed[0][0]}\n{failed[0][1]}")
    return elapsed


def one_node_cases() -> dict[str, Callable[[], float]]:
    cases = {
        "torchrun --standalone": lambda: together([[*TORCHRUN, "--standalone", "--nproc-per-node", "2", WORKER]]),
        "hpctorch run (per node)": lambda: together([[*HPCTORCH, "--nproc-per-node", "2", WORKER]]),
    }
    if shutil.which("mpirun"):
        cases["mpirun -np 2 hpctorch run (per task)"] = lambda: together([[*MPIRUN, "-np", "2", *HPCTORCH, WORKER]])
    return cases


def simulated_two_node_cases() -> dict[str, Callable[[], float]]:
    def torchrun() -> float:
        port = str(free_port(""))
        return together([[*TORCHRUN, "--nnodes", "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1",
                          "--master-port", port, "--nproc-per-node", "2", WORKER] for rank in (0, 1)])

    return {
        "torchrun x 2 agents (hand-given ranks)": torchrun,
        "hpctorch run --simulate-nodes 2": lambda: together([[*HPCTORCH, "--simulate-nodes", "2", "--nproc-per-node", "2", WORKER]]),
    }


def cluster_two_node_cases(cluster, job_dir: Path) -> dict[str, Callable[[], float]]:  # type: ignore[no-untyped-def]
    from tests.cluster.harness import fabric_addr

    hosts = job_dir / "hosts"
    hosts.write_text("".join(f"{fabric_addr(i)} slots=2\n" for i in (1, 2)))
    env = cluster.env()

    def torchrun() -> float:
        # Hand-given like the ranks: without GLOO_SOCKET_IFNAME gloo takes the address the
        # host name resolves to, on the unreachable management network, and hangs.
        port = str(free_port(""))
        return together([cluster.on(node, [*TORCHRUN, "--nnodes", "2", "--node-rank", str(rank), "--master-addr", fabric_addr(1),
                                           "--master-port", port, "--nproc-per-node", "2", WORKER])
                         for rank, node in enumerate(cluster.names)], cluster.env(GLOO_SOCKET_IFNAME="hsn0"))

    def srun(*argv: str) -> list[str]:
        return cluster.on("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), "srun", "-N2", *argv])

    return {
        "torchrun on each node (hand-given ranks)": torchrun,
        "hpctorch run --hostfile on each node (per node)": lambda: together(
            [cluster.on(node, [*HPCTORCH, "--hostfile", str(hosts), WORKER]) for node in cluster.names], env),
        "srun --ntasks-per-node=2 hpctorch run (per task)": lambda: together(
            [srun("--ntasks-per-node=2", "--kill-on-bad-exit=1", *HPCTORCH, WORKER)], env),
        "srun --ntasks-per-node=2 true (srun's own cost)": lambda: together([srun("--ntasks-per-node=2", "true")], env),
    }


def torchrun_without_interface(cluster, limit_s: float = 60) -> str:  # type: ignore[no-untyped-def]
    """One try of torchrun given ranks, master and port but no GLOO_SOCKET_IFNAME."""
    from tests.cluster.harness import fabric_addr

    port = str(free_port(""))
    try:
        elapsed = together([cluster.on(node, [*TORCHRUN, "--nnodes", "2", "--node-rank", str(rank), "--master-addr", fabric_addr(1),
                                              "--master-port", port, "--nproc-per-node", "2", WORKER])
                            for rank, node in enumerate(cluster.names)], cluster.env(), timeout=limit_s)
    except subprocess.TimeoutExpired:
        return f"did not finish in {limit_s:.0f} s (killed): gloo used the address the host name resolves to"
    except RuntimeError as exc:
        return f"failed: {str(exc).splitlines()[0][:200]}"
    return f"finished in {elapsed:.2f} s"


def rows(times: dict[str, list[float]], reference: str) -> list[list[str]]:
    base = summary(times[reference])["median"]
    out = []
    for name, values in times.items():
        s = summary(values)
        out.append([name, f"{s['median']:.2f}", f"{s['min']:.2f} / {s['max']:.2f}", f"{s['median'] / base:.2f}"])
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    # 9, not 5: torchrun's median here moves 0.5 s between runs of 5 (4.5-5.0 s on two nodes).
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--smoke", action="store_true", help="one run of the one-node cases only")
    parser.add_argument("--no-cluster", action="store_true", help="simulate two nodes even when root")
    args = parser.parse_args(argv)
    repeats = 1 if args.smoke else args.repeats
    # Compiled first, as pip does on install (this workplace sets PYTHONDONTWRITEBYTECODE:
    # an editable install would compile every hpctorch module in every rank, every run).
    import compileall

    import hpctorch

    compileall.compile_dir(Path(hpctorch.__file__).parent, quiet=1)
    results: dict[str, dict] = {}
    header = ["command", "median s", "min / max s", "ratio to torchrun"]
    one = interleaved(one_node_cases(), repeats)
    results["1 node x 2"] = {"times": one, "where": "this machine"}
    print(table(header, rows(one, next(iter(one)))))
    if not args.smoke:
        if cluster_available() and not args.no_cluster:
            from tests.cluster.harness import Cluster

            cluster = Cluster(2).up()
            job_dir = Path(tempfile.mkdtemp(prefix="hpctorch-bench-"))
            job_dir.chmod(0o755)
            try:
                two = interleaved(cluster_two_node_cases(cluster, job_dir), repeats)
                results["torchrun without GLOO_SOCKET_IFNAME"] = torchrun_without_interface(cluster)
                print(f"torchrun without GLOO_SOCKET_IFNAME: {results['torchrun without GLOO_SOCKET_IFNAME']}")
            finally:
                cluster.down()
                shutil.rmtree(job_dir, ignore_errors=True)
            where = "2 network namespaces (the test cluster: bridge, real slurmd per node)"
        else:
            two = interleaved(simulated_two_node_cases(), repeats)
            where = "2 simulated nodes on loopback"
        results["2 nodes x 2"] = {"times": two, "where": where}
        print(table(header, rows(two, next(iter(two)))))
    if not args.smoke:
        save("first_collective", {"repeats": repeats, "results": results})


if __name__ == "__main__":
    main()

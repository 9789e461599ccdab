"""``hpctorch stacks``: every worker's stacks in a live job, grouped, printed on node 0.

Started on the job's nodes the way the job was (``srun --jobid J --overlap
--ntasks-per-node=1 hpctorch stacks``; one per host under a hostfile; plainly on one
machine). Each finds this user's workers of the job here (the torchrun variables in their
environment), takes their stacks (``stacks.dump``) and keeps the full dump in a local file.
Nodes other than 0 send their groups to node 0 through the job's own store (its
MASTER_ADDR/MASTER_PORT, torch's TCPStore): one key each. Node 0 prints the summary.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping

from ..errors import HpctorchError
from ..schedulers import hostlist
from . import groups
from .dump import Worker, capture
from .job import collect, publish, rank_variables, ranks_among, worker_of, write_dump


def _job_processes(env: Mapping[str, str]) -> dict[str, list[tuple[int, Mapping[str, str]]]]:
    """This user's training processes here, by run id: torchrun's variables in their environment
    (``ranks_among``: not a rank's data loaders)."""
    import psutil

    uid = os.getuid() if hasattr(os, "getuid") else None
    own_net = _net_namespace("self")
    found: dict[int, tuple[int, Mapping[str, str]]] = {}
    for process in psutil.process_iter(["pid", "ppid", "uids"]):
        try:
            if uid is not None and process.info["uids"] and process.info["uids"].real != uid:
                continue
            if own_net is not None and _net_namespace(str(process.pid)) not in (None, own_net):
                continue  # another node on this machine (network namespaces, as the test cluster's)
            penv = rank_variables(process.pid, process.environ())
        except psutil.Error:
            continue
        if penv is None or "TORCHELASTIC_RUN_ID" not in penv or process.pid == os.getpid():
            continue
        if env.get("SLURM_JOB_ID") and penv.get("SLURM_JOB_ID") != env["SLURM_JOB_ID"]:
            continue  # srun --jobid J --overlap: only job J's workers
        found[process.pid] = (process.info["ppid"], penv)
    by_run: dict[str, list[tuple[int, Mapping[str, str]]]] = {}
    for pid, penv in ranks_among(found):
        by_run.setdefault(penv["TORCHELASTIC_RUN_ID"], []).append((pid, penv))
    return by_run


def _net_namespace(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def _host(penv: Mapping[str, str], node: int) -> str:
    try:
        names = hostlist.expand(penv.get("HPCTORCH_NODELIST", ""))
    except Exception:  # noqa: BLE001 - not ours to judge here
        names = []
    return names[node] if 0 <= node < len(names) and len(names) > 1 else socket.gethostname()


def workers_here(env: Mapping[str, str], run_id: str | None = None) -> tuple[list[Worker], Mapping[str, str]]:
    """The job's workers on this node and one worker's environment (the job's facts)."""
    runs = _job_processes(env)
    if run_id is not None:
        runs = {r: p for r, p in runs.items() if r == run_id}
    if not runs:
        who = f"run id {run_id}" if run_id else "a torchrun-style job (RANK, TORCHELASTIC_RUN_ID)"
        raise HpctorchError(f"no workers of {who} of this user on {socket.gethostname()}",
                            "run hpctorch stacks on the job's nodes (srun --jobid J --overlap ...), as the job's user")
    if len(runs) > 1:
        raise HpctorchError(f"{len(runs)} jobs of yours run here (run ids {', '.join(sorted(runs))})", "pick one with --run-id")
    (_run, processes), = runs.items()
    workers = [worker_of(pid, penv, _host) for pid, penv in processes]
    return sorted(workers, key=lambda w: w.rank), processes[0][1]


def run(env: Mapping[str, str], run_id: str | None, method: str, timeout_s: float, native: bool) -> int:
    workers, job = workers_here(env, run_id)
    nnodes = int(job.get("GROUP_WORLD_SIZE") or 1)
    here = sorted({w.node for w in workers})
    stacks = capture(workers, method, budget_s=min(5.0, timeout_s), native=native)
    dump = write_dump(stacks, f"node{here[0]}")
    part = groups.groups(stacks)
    if len(here) == nnodes:
        print("\n".join(groups.summary(groups.merge([part]), nnodes, dump)), flush=True)
        return 0
    store = _store(job, timeout_s)
    if store is None:
        print(f"hpctorch: the job's store at {job.get('MASTER_ADDR')}:{job.get('MASTER_PORT')} cannot be reached; "
              f"this node's ranks only", file=sys.stderr)
        print("\n".join(groups.summary(groups.merge([part]), len(here), dump)), flush=True)
        return 1
    prefix = f"hpctorch/{job['TORCHELASTIC_RUN_ID']}/stacks-on-demand/"
    if 0 not in here:
        publish(store, prefix, here, part)
        return 0
    parts, covered = collect(store, prefix, set(here), nnodes, timeout_s)
    missing = [f"node {n}" for n in range(nnodes) if n not in covered]
    print("\n".join(groups.summary(groups.merge([part, *parts]), nnodes, dump, missing)), flush=True)
    return 0


def _store(job: Mapping[str, str], timeout_s: float):  # type: ignore[no-untyped-def]
    from ..storeclient import open_client

    try:  # not torch's client alone: it waits for ever on a listener that never answers
        return open_client(job["MASTER_ADDR"], int(job["MASTER_PORT"]), max(1.0, min(10.0, timeout_s)))
    except (KeyError, ValueError, RuntimeError, OSError):
        return None


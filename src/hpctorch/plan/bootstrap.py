"""The seed's method for MPI launchers: allgather (host, address), number the nodes.

``mpi_exchange`` runs ``python -m hpctorch.bootstrap`` as a short-lived child: the
child initialises MPI in place of this rank (this process never does, so the agent
and the training processes it later forks or execs never carry an MPI runtime),
allgathers each rank's host name and address on the chosen interface, and has
rank 0 pick a free port. ``from_records`` turns that into the Allocation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import replace

from ..errors import HpctorchError
from ..progress import Progress
from ..schedulers._hostfiles import group_slots
from ..schedulers.allocation import Allocation, launched_by_tasks


def from_records(allocation: Allocation, rank: int, records: list[list[str]], port: int) -> Allocation:
    """Nodes by distinct host name in rank order; master = rank 0's address."""
    hosts = [host for host, _ in records]
    nodes, tasks = group_slots(hosts)
    own = hosts[rank]
    # Global ranks must be contiguous per node for torch's LOCAL_RANK/GROUP_RANK to
    # agree with them; mpirun's default by-slot mapping gives that, cyclic does not.
    expected = [node for node, count in zip(nodes, tasks) for _ in range(count)]
    if hosts != expected:
        raise HpctorchError(
            "MPI placed consecutive ranks on different nodes (a cyclic or round-robin mapping)",
            "map ranks by slot or core (mpirun --map-by slot, the default) so each node holds a block of ranks",
        )
    multi = len(nodes) > 1
    sources = dict(allocation.sources)
    sources.update(
        nodes="mpi4py allgather of host names",
        node_rank="mpi4py allgather of host names",
        master_port="mpi4py bcast: a port free on rank 0",
    )
    if multi:
        sources["master_addr"] = "mpi4py allgather: rank 0's address"
    return replace(
        allocation,
        nodes=nodes,
        tasks_per_node=tasks,
        launched=launched_by_tasks(tasks),
        node_rank=nodes.index(own),
        local_task_rank=hosts[:rank].count(own),
        master_addr=records[0][1] if multi else None,
        master_port=port,
        sources=sources,
    )


def mpi_exchange(allocation: Allocation, iface: str | None, timeout_s: float) -> Allocation:
    """Run the allgather child and fold its answer into ``allocation``."""
    # A PMI-1 launcher (Hydra, Flux, PALS) hands the task a socket in PMI_FD: the child's
    # MPI_Init needs it, and subprocess closes inherited descriptors unless told.
    pmi_fd = os.environ.get("PMI_FD", "")
    env, asked = _mpi4py_env(allocation, os.environ)
    child = subprocess.Popen([sys.executable, "-m", "hpctorch.plan.bootstrap", iface or ""], stdout=subprocess.PIPE, env=env,
                             stderr=subprocess.PIPE, text=True, pass_fds=(int(pmi_fd),) if pmi_fd.isdigit() else ())
    progress = Progress(timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            out, err = child.communicate(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
            break
        except subprocess.TimeoutExpired:
            if time.monotonic() > deadline:
                child.kill()
                child.communicate()
                progress.done()
                raise HpctorchError(
                    f"the MPI bootstrap allgather did not finish in {timeout_s:.0f} s",
                    "check that every rank runs hpctorch, or raise --rdzv-timeout",
                ) from None
            if allocation.task_rank == 0:  # one line per job, from the rank the others wait with
                progress.tick(lambda: f"waiting for the MPI allgather of {allocation.ntasks:,} ranks")
    progress.done()
    if child.returncode != 0 or not out.strip():
        detail = (err.strip().splitlines() or ["no output"])[-1]
        fix = "pip install 'hpctorch[mpi]' (mpi4py built for this MPI)" if "mpi4py" in err else "check the MPI installation"
        raise HpctorchError(f"{allocation.scheduler} names no nodes and the mpi4py bootstrap failed: {detail}", fix + ", or give --master-addr/--node-rank")
    answer = json.loads(out.strip().splitlines()[-1])
    if answer.get("size", 0) == 1 and allocation.ntasks > 1:
        # Never a silent world of one: each task would run a job of its own.
        raise HpctorchError(
            f"{allocation.scheduler} started {allocation.ntasks} tasks ({allocation.sources.get('tasks_per_node', '')}), but "
            f"MPI in this task sees a world of 1: mpi4py loaded {answer.get('library', 'another MPI')} ({asked}), "
            "not the MPI of the launcher",
            "set MPI4PY_LIBMPI to the launcher's libmpi (its full path), or pip install --no-binary mpi4py mpi4py "
            "with that MPI's mpicc first on PATH",
        )
    if answer["rank"] != allocation.task_rank:
        raise HpctorchError(
            f"the bootstrap ran as MPI rank {answer['rank']}, but {allocation.sources.get('task_rank')} says {allocation.task_rank}",
            "MPI variables of another job leaked into this one; unset them",
        )
    return from_records(allocation, answer["rank"], answer["records"], answer["port"])


def _mpi4py_env(allocation: Allocation, env: Mapping[str, str]) -> tuple[dict[str, str], str]:
    """The child's environment: mpi4py's wheels carry both the MPICH and the Open MPI ABI and
    load whichever ``libmpi.so`` the system points at, which need not be the launcher's MPI
    (Debian: Open MPI's, under MPICH's mpiexec). Ask for the launcher's family unless the
    user chose. Also: what was asked, for the error line."""
    child = dict(env)
    for var in ("MPI4PY_LIBMPI", "MPI4PY_MPIABI"):
        if var in env:
            return child, f"{var}={env[var]} from the environment"
    libraries = allocation.launcher.mpi_libraries
    if not libraries:
        return child, "the system's libmpi"
    child["MPI4PY_LIBMPI"] = os.pathsep.join(libraries)
    return child, f"hpctorch asked for {' or '.join(libraries)}, {allocation.scheduler}'s family"


def _mpich_soname_shim() -> None:
    """Debian's and Ubuntu's MPICH ship libmpich.so.12 but no libmpi.so.12, the name mpi4py's
    MPICH-ABI module links to (Intel MPI, MVAPICH2 and Cray MPICH have it). Then: a private
    directory holding that name for the library, on LD_LIBRARY_PATH, and this child again
    (the loader reads the path at start; an exec keeps PMI_FD)."""
    if "libmpi.so.12" not in os.environ.get("MPI4PY_LIBMPI", "").split(os.pathsep) or os.environ.get("HPCTORCH_MPICH_SHIM"):
        return
    import ctypes

    try:
        ctypes.CDLL("libmpi.so.12")
        return
    except OSError:
        pass
    try:
        ctypes.CDLL("libmpich.so.12")
        with open("/proc/self/maps", encoding="utf-8") as maps:
            real = next(line.split()[-1] for line in maps if "libmpich.so.12" in line)
    except (OSError, StopIteration):
        return
    from ..host.folders import node_dir, private_dir

    try:  # put first on the library path: only a folder no one else can have prepared
        shim = private_dir(os.path.join(private_dir(node_dir()), "mpich-abi"))
    except HpctorchError as exc:
        sys.stderr.write(f"hpctorch: no libmpi.so.12 name for MPICH: {exc.line()}\n")
        return
    link = os.path.join(shim, "libmpi.so.12")
    if os.path.realpath(link) != os.path.realpath(real):
        temporary = f"{link}.{os.getpid()}"
        os.symlink(real, temporary)
        os.replace(temporary, link)  # atomic: the other ranks of this node may be here too
    env = dict(os.environ, HPCTORCH_MPICH_SHIM="1",
               LD_LIBRARY_PATH=os.pathsep.join(p for p in (shim, os.environ.get("LD_LIBRARY_PATH")) if p))
    os.execve(sys.executable, [sys.executable, "-m", "hpctorch.plan.bootstrap", *sys.argv[1:]], env)


def _child(iface: str) -> None:
    import socket

    _mpich_soname_shim()

    from mpi4py import MPI

    from ..host.network import free_port, list_interfaces

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    address = next((i.address for i in list_interfaces() if i.name == iface and i.address), "") if iface else ""
    records = comm.allgather((socket.gethostname(), address))
    port = free_port(address or "0.0.0.0") if rank == 0 else 0
    port = comm.bcast(port, root=0)
    version = MPI.Get_library_version().replace("\x00", "").strip()
    library = version.splitlines()[0].split(",")[0] if version else "?"
    sys.stdout.write(json.dumps({"rank": rank, "size": comm.Get_size(), "library": library, "records": records, "port": port}) + "\n")
    sys.stdout.flush()
    MPI.Finalize()


if __name__ == "__main__":
    _child(sys.argv[1] if len(sys.argv) > 1 else "")

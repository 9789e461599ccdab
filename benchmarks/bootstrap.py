"""Benchmark 4: the MPI bootstrap's allgather with 2..64 ranks (oversubscribed on this
machine), and the shared-file exchange of the master's address with 2..64 processes.

MPI: wall time of `mpirun -np N hpctorch plan --json` (every rank detects the job and
runs the allgather child) against `mpirun -np N python -c pass`.
Shared file: N processes start together; node 0 writes its address, the others poll
for it. Wall time of all N, and the time from the write to the last reader's answer.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from .common import PYTHON, clean_env, save, summary, table, timed

MPIRUN = ("mpirun", "--oversubscribe", "--allow-run-as-root")


def mpi(n: int, repeats: int) -> dict[str, float]:
    base, plan = [], []
    for _ in range(repeats):
        elapsed, done = timed([*MPIRUN, "-np", str(n), PYTHON, "-c", "pass"], env=clean_env())
        base.append(elapsed)
        outputs = tempfile.mkdtemp(prefix="hpctorch-bench-mpi-")
        # One file per rank (OpenMPI's --output-filename): N JSON documents on one pipe interleave.
        elapsed, done = timed([*MPIRUN, "--output-filename", outputs, "-np", str(n), PYTHON, "-m", "hpctorch", "plan", "--json"], env=clean_env())
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-2000:])
        documents = [json.loads(path.read_text()) for path in Path(outputs).rglob("stdout")]
        shutil.rmtree(outputs, ignore_errors=True)
        assert len(documents) == n and {d["world_size"] for d in documents} == {n}, (len(documents), n)
        plan.append(elapsed)
    return {"python": summary(base)["median"], "hpctorch": summary(plan)["median"]}


NODE = """
import socket, sys, time
from hpctorch.plan.types import Plan
from hpctorch.plan.rendezvous import read_master, write_master
node, count, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
plan = Plan(mode="per-node", scheduler="hostfile", job_id=None, nodes=(socket.gethostname(),) + tuple(f"n{i}" for i in range(1, count)), node_rank=node,
            nproc_per_node=(1,) * count, master_addr="198.18.0.1" if node == 0 else None, master_port=29400, rdzv_backend="static",
            rdzv_timeout=60, run_id="bench", iface=None, simulated=False, max_restarts=0, workers=(), common_env={},
            master_exchange=path)
if node == 0:
    write_master(plan)
else:
    got = read_master(plan)
    assert got == "198.18.0.1", got
print(time.time())
"""


def shared_file(n: int, repeats: int) -> dict[str, float]:
    walls, spreads = [], []
    for _ in range(repeats):
        directory = tempfile.mkdtemp(prefix="hpctorch-bench-exchange-")
        path = f"{directory}/.hpctorch/bench.master.json"
        started = time.perf_counter()
        processes = [subprocess.Popen([PYTHON, "-c", NODE, str(i), str(n), path], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=clean_env()) for i in range(n)]
        outputs = [p.communicate(timeout=120) for p in processes]
        walls.append(time.perf_counter() - started)
        if any(p.returncode for p in processes):
            raise RuntimeError(next(err for (_, err), p in zip(outputs, processes) if p.returncode)[-2000:])
        written = float(outputs[0][0])
        spreads.append(max(float(out) for out, _ in outputs[1:]) - written)
        shutil.rmtree(directory, ignore_errors=True)
    return {"wall": summary(walls)["median"], "write_to_last_read": summary(spreads)["median"]}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    sizes = [2] if args.smoke else [2, 4, 8, 16, 32, 64]
    repeats = 1 if args.smoke else args.repeats
    data: dict[str, list] = {"mpi": [], "shared_file": []}
    if shutil.which("mpirun"):
        for n in sizes:
            data["mpi"].append({"ranks": n, **mpi(n, repeats)})
        print(table(["ranks", "mpirun python -c pass s", "mpirun hpctorch plan s", "difference s"],
                    [[d["ranks"], f"{d['python']:.2f}", f"{d['hpctorch']:.2f}", f"{d['hpctorch'] - d['python']:.2f}"] for d in data["mpi"]]))
    else:
        print("mpirun not found: MPI bootstrap not measured", file=sys.stderr)
    for n in sizes:
        data["shared_file"].append({"processes": n, **shared_file(n, repeats)})
    print(table(["processes", "wall s (start to all done)", "write to last read s"],
                [[d["processes"], f"{d['wall']:.2f}", f"{d['write_to_last_read']:.3f}"] for d in data["shared_file"]]))
    if not args.smoke:
        save("bootstrap", data)


if __name__ == "__main__":
    main()

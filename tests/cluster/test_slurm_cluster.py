"""hpctorch on a real 2-node Slurm cluster, run the way users run it."""

from __future__ import annotations

import json
import re
from collections import Counter
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from ..conftest import ROOT, WAIT_FOR_STANDBYS
from .conftest import PYTHON, TOY, assert_trained_across_nodes, toy_ranks
from .harness import Cluster

pytestmark = pytest.mark.cluster
HPCTORCH = (PYTHON, "-m", "hpctorch")


def sbatch(cluster: Cluster, job_dir: Path, body: str, *options: str) -> str:
    script = job_dir / "job.sh"
    script.write_text("#!/bin/sh\n" + body + "\n")
    state, output = cluster.sbatch(job_dir, script, *options)
    assert state == "COMPLETED", (state, output)
    return output


def test_sbatch_with_srun_per_node(cluster: Cluster, job_dir: Path) -> None:
    body = f"srun {' '.join(HPCTORCH)} run --nproc-per-node 2 {TOY} --steps 6"
    output = sbatch(cluster, job_dir, body, "-N2", "--ntasks-per-node=1")
    assert_trained_across_nodes(output)


def test_batch_script_without_srun_starts_every_rank_as_a_task(cluster: Cluster, job_dir: Path) -> None:
    # The job asked for 2 tasks per node: srun starts every rank, no agent imports torch first.
    output = sbatch(cluster, job_dir, f"{' '.join(HPCTORCH)} run {TOY} --steps 6", "-N2", "--ntasks-per-node=2")
    assert "re-running under 'srun --nodes=2 --ntasks-per-node=2 --kill-on-bad-exit=1' (per task" in output, output[-2000:]
    assert_trained_across_nodes(output)
    assert {r["agent"] for r in toy_ranks(output)} == {"none"}


def test_batch_script_with_one_cpu_per_node_starts_one_hpctorch_per_node(cluster: Cluster, job_dir: Path) -> None:
    output = sbatch(cluster, job_dir, f"{' '.join(HPCTORCH)} run --nproc-per-node 2 {TOY} --steps 6", "-N2", "--ntasks-per-node=1")
    assert "re-running under 'srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1' (one hpctorch per node" in output, output[-2000:]
    assert "1 CPU(s) on a node, too few for 2 tasks" in output
    assert_trained_across_nodes(output)
    # hpctorch starts each node's workers itself (no torch agent), prefixing their output.
    assert {r["agent"] for r in toy_ranks(output)} == {"none"}
    assert re.search(r"^\[\S+ rank 0\]: ", output, re.M), output[-2000:]


def test_srun_per_task(cluster: Cluster, job_dir: Path) -> None:
    done = cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), "srun", "-N2", "--ntasks-per-node=2", "--kill-on-bad-exit=1", *HPCTORCH, "run", TOY, "--steps", "6"])
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert_trained_across_nodes(done.stdout)


def test_init_under_srun_without_a_launcher(cluster: Cluster, job_dir: Path) -> None:
    done = cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), "srun", "-N2", "--ntasks-per-node=2", "--kill-on-bad-exit=1", PYTHON, TOY, "--init", "hpctorch", "--steps", "6"])
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert_trained_across_nodes(done.stdout)


def test_a_killed_worker_ends_the_job_under_srun_without_kill_on_bad_exit(cluster: Cluster, job_dir: Path) -> None:
    # srun alone would wait for the surviving tasks: hpctorch's watchdog must end them.
    compute = ROOT / "tests" / "fixtures" / "compute.py"
    body = (f"srun --label --kill-on-bad-exit=0 {' '.join(HPCTORCH)} run --nproc-per-node 2 {compute} --seconds 60 "
            f"--die-rank 3 --death-marker {job_dir}/died\n"
            f"code=$?\necho srun exit $code\n{PYTHON} -c 'import time; print(time.time())' > {job_dir}/ended\nexit $code")
    script = job_dir / "job.sh"
    script.write_text("#!/bin/sh\n" + body + "\n")
    state, output = cluster.sbatch(job_dir, script, "-N2", "--ntasks-per-node=1")
    elapsed = float((job_dir / "ended").read_text()) - float((job_dir / "died").read_text())
    assert "srun exit 0" not in output, output[-3000:]
    # Each node says it: node 1 (task 1) names its own dead rank, node 0 (task 0) was stopped for it.
    assert "1: hpctorch: rank 3 on node 1 (node2) (local rank 1) was killed by signal 9" in output, output[-3000:]
    assert "0: hpctorch: stopped: rank 3 on node 1 (node2) (local rank 1) was killed by signal 9" in output, output[-3000:]
    assert state == "FAILED", (state, output[-3000:])
    # No time limit here (benchmarks/teardown.py measures it): without the watchdog the
    # survivors compute 60 s and then wait in the barrier until sbatch's hang guard.
    print(f"srun without --kill-on-bad-exit: job ended {elapsed:.2f} s after the kill")


def test_max_restarts_restarts_every_node_and_gives_up_in_one_line(cluster: Cluster, job_dir: Path) -> None:
    import json

    report = str(ROOT / "tests" / "fixtures" / "report.py")
    srun = ("sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), "srun", "-N2", "--ntasks-per-node=1", "--kill-on-bad-exit=0",
            *HPCTORCH, "run", "--max-restarts", "1", "--nproc-per-node", "2", report, "--init", "--brief")
    # Rank 3 (node2) fails once: node2 restarts for its own failure, node1 because torch's
    # c10d rendezvous tells it a node is waiting; all four meet again in a fresh store.
    done = cluster.run("node1", [*srun, "--fail-first", "3"], timeout=240)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    reports = [json.loads(line.split("REPORT ", 1)[1]) for line in done.stdout.splitlines() if "REPORT " in line]
    assert sorted(r["rank"] for r in reports) == [0, 1, 2, 3] and {r["rank_sum"] for r in reports} == {6.0}
    assert {r["host"]: r["env"]["TORCHELASTIC_RESTART_COUNT"] for r in reports} == {"node1": "0", "node2": "1"}
    # Rank 3 fails every time: once its restarts are used up, every node stops and node 0 says why.
    done = cluster.run("node1", [*srun, "--fail-rank", "3"], timeout=240)
    assert done.returncode != 0
    assert "rank 3 on node 1 (node2) (local rank 1) exited with code 3" in done.stderr, done.stderr[-3000:]
    assert "rendezvous at" not in done.stderr, done.stderr[-3000:]
    # Elastic (--nnodes MIN:MAX, as with torchrun): the same restart.
    after_run = srun.index("run") + 1
    elastic = [*srun[:after_run], "--nnodes", "1:2", "--rdzv-backend", "c10d", *srun[after_run:], "--fail-first", "3"]
    done = cluster.run("node1", elastic, timeout=240)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert {json.loads(line.split("REPORT ", 1)[1])["rank_sum"] for line in done.stdout.splitlines() if "REPORT " in line} == {6.0}


def test_twenty_restarts_in_a_row_are_each_clean(cluster: Cluster, job_dir: Path) -> None:
    """#43: no byte of an old attempt reaches a new one. Rank 3 (node2) dies after its second
    collective in every attempt (every rank has said READY) while its peers are inside their next ones; each of the 21
    attempts meets whole (4 ranks, the right sum) until the restarts are used up, and the job
    ends on rank 3's exit, never on a gloo error of a new worker that met an old one."""
    report = str(ROOT / "tests" / "fixtures" / "report.py")
    srun = ("sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), "srun", "-N2", "--ntasks-per-node=1", "--kill-on-bad-exit=0",
            *HPCTORCH, "run", "--max-restarts", "20", "--nproc-per-node", "2", report, "--init", "--brief",
            "--collectives", "600", "--crash-rank", "3")
    done = cluster.run("node1", srun, timeout=600)
    met = re.findall(r"READY rank=(\d) host=\S+ sum=(\d+) attempt=(\d+)", done.stdout)
    # Every rank in every attempt, each in a 4-rank all_reduce (0+1+2+3). Node2 restarts for its
    # own failure each time (its count is the attempt's); node1, restarted by its peer's, keeps a
    # lower count (torch's agent counts only its own failures).
    assert {total for _rank, total, _attempt in met} == {"6"}, met
    # Printed, not in the assertion's message (pytest cuts that short): what every node said, and where the whole output is.
    (job_dir / "stderr.txt").write_text(done.stderr)
    print("\n".join(line for line in done.stderr.splitlines() if "hpctorch:" in line and "warm standby" not in line))
    print(f"attempts met: {met}\nthe whole output: {job_dir / 'stderr.txt'}")
    assert sorted(Counter(rank for rank, _total, _attempt in met).items()) == [(r, 21) for r in "0123"], done.stderr[-3000:]
    assert sorted({int(attempt) for rank, _total, attempt in met if rank in "23"}) == list(range(21)), met
    assert done.returncode != 0
    assert "rank 3 on node 1 (node2) (local rank 1) exited with code 3" in done.stderr, done.stderr[-3000:]
    for broken in ("doesn't match", "rendezvous at"):
        assert broken not in done.stderr, done.stderr[-3000:]


WARM = """
import os, sys, time
import torch, torch.distributed as dist
""" + WAIT_FOR_STANDBYS + """
died = os.path.join(os.path.dirname(os.path.abspath(__file__)), "died")
# The attempt by rank 3's mark: torch's TORCHELASTIC_RESTART_COUNT is each node's own, and node1,
# restarted for its peer's failure, keeps 0.
attempt = 1 if os.path.exists(died) else 0
dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
with open("/proc/self/cmdline", "rb") as source:
    standby = b"--standby" in source.read().split(b"\\0")
with open("/proc/self/stat") as source:
    started = float(source.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
print(f"attempt={attempt} rank={dist.get_rank()} world={dist.get_world_size()} sum={total.item():.0f} standby={standby} "
      f"pid={os.getpid()} started={started:.2f} host={os.uname().nodename}", flush=True)
if attempt == 0:
    if dist.get_rank() == 3:
        wait_for_standbys(4)  # each node's two, made once its ranks trained (the straggler watch's files)
        with open("/proc/uptime") as source:
            print(f"dies at {float(source.read().split()[0]):.2f}", flush=True)
        open(died, "w").close()
        os._exit(7)
    time.sleep(120)  # in no collective: torch's agent stops it for the restart
dist.destroy_process_group()
"""


def test_a_warm_restart_runs_the_script_in_each_nodes_standbys(cluster: Cluster, job_dir: Path) -> None:
    """#43: after rank 3 (node2) dies, every rank of the next attempt, on both nodes, is a process
    started before the failure as a standby (its start time), with the new attempt's world and sum."""
    script = job_dir / "warm.py"
    script.write_text(WARM)
    srun = ("sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), "srun", "-N2", "--ntasks-per-node=1", "--kill-on-bad-exit=0",
            *HPCTORCH, "run", "--max-restarts", "1", "--nproc-per-node", "2", str(script))
    done = cluster.run("node1", srun, timeout=300, JOB_MARK=uuid.uuid4().hex)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    seen = [dict(re.findall(r"(\w+)=(\S+)", line)) for line in done.stdout.splitlines() if "attempt=" in line]
    first = [r for r in seen if r["attempt"] == "0"]
    again = [r for r in seen if r["attempt"] == "1"]
    assert sorted(r["rank"] for r in first) == sorted(r["rank"] for r in again) == ["0", "1", "2", "3"], done.stdout[-3000:]
    assert {(r["world"], r["sum"]) for r in again} == {("4", "4")}, again
    # Every worker is forked from its node's zygote (the first attempt's told to go at once); the next
    # attempt's waited ahead of the failure.
    assert {r["standby"] for r in seen} == {"True"}, seen
    assert {r["host"] for r in again} == {"node1", "node2"}
    died = float(re.search(r"dies at (\S+)", done.stdout).group(1))  # type: ignore[union-attr]
    assert all(float(r["started"]) < died for r in again), (died, again)  # started ahead of the failure
    assert done.stderr.count("hpctorch: 2 of 2 worker(s) of this attempt run in their warm standby") == 2, done.stderr[-3000:]


def test_interface_trap_fails_fast_on_the_management_net_and_passes_on_the_fabric(cluster: Cluster, job_dir: Path) -> None:
    srun = ("srun", "-N2", "--ntasks-per-node=1", "--kill-on-bad-exit=1")
    # Forced onto the management interface the hostnames resolve to: node2 cannot reach node1.
    bad = cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), *srun, *HPCTORCH, "run", "--iface", "mgmt0", "--rdzv-timeout", "10", "--nproc-per-node", "2", TOY], timeout=120)
    assert bad.returncode != 0  # within the rendezvous timeout of 10 s; timeout=120 guards a hang
    # Whichever node's timeout ends it first names the unreachable management address.
    assert ("hpctorch: error: could not reach the master's store at 198.19.0.1:" in bad.stderr
            or "hpctorch: error: waited 10 s for node(s) 1 (node2) to reach the master's store at 198.19.0.1:" in bad.stderr), bad.stderr
    # By default hpctorch picks the fabric and exchanges node1's fabric address itself.
    good = cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), *srun, *HPCTORCH, "run", "--verbose", "--nproc-per-node", "2", TOY, "--steps", "6"])
    assert good.returncode == 0, (good.stdout[-2000:], good.stderr[-3000:])
    assert_trained_across_nodes(good.stdout)
    # Node 0 prints the plan: the fabric interface, and its address written for node2, whose
    # lookup of the name node1 gives the management address.
    assert "GLOO_SOCKET_IFNAME=hsn0" in good.stderr, good.stderr[-3000:]
    assert "written to" in good.stderr and "(its name resolves elsewhere)" in good.stderr, good.stderr[-3000:]


def test_hpctorch_submit_writes_a_script_slurm_runs(cluster: Cluster, job_dir: Path) -> None:
    done = cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), *HPCTORCH, "submit", "--scheduler", "slurm",
                                 "--nodes", "2", "--nproc-per-node", "2", "--time", "5", "--job-name", "toy", TOY, "--steps", "6"])
    assert done.returncode == 0, done.stderr
    match = re.search(r"submitted slurm job (\d+); script: (\S+); logs: (\S+)", done.stdout)
    assert match, done.stdout
    job_id, script, logs = match.groups()
    assert logs == f"hpctorch-toy-{job_id}.out" and (job_dir / script).exists()
    assert cluster.wait_job(job_id) == "COMPLETED"
    assert_trained_across_nodes((job_dir / logs).read_text())


def test_preemption_signal_reaches_every_rank_and_the_job_is_requeued(cluster: Cluster, job_dir: Path) -> None:
    markers = job_dir / "markers"
    markers.mkdir()
    script = job_dir / "job.sh"
    preemptible = str(Path(TOY).parent.parent / "tests" / "fixtures" / "preemptible.py")
    summary = job_dir / "summary.json"
    script.write_text(f"#!/bin/sh\nsrun {' '.join(HPCTORCH)} run --requeue --summary-json {summary} --nproc-per-node 2 {preemptible} --markers {markers}\n")
    out = job_dir / "out.txt"
    submitted = cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), "sbatch", "--parsable", "--requeue", "-N2", "--ntasks-per-node=1", "-o", str(out), str(script)], timeout=30)
    job_id = submitted.stdout.strip()
    deadline = time.monotonic() + 120
    while (not out.exists() or out.read_text().count("READY") < 4) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert out.read_text().count("READY") == 4, out.read_text()[-2000:]
    signalled = subprocess.run(["scancel", "--signal=USR1", job_id], env=cluster.env(), capture_output=True, text=True, timeout=30)
    assert signalled.returncode == 0, signalled.stderr
    # Every rank checkpoints; node 0 requeues; the second run finds SLURM_RESTART_COUNT=1 and resumes.
    deadline = time.monotonic() + 300
    last_hurry = 0.0
    pending_since: float | None = None
    shown = ""
    while len(list(markers.glob("*.resumed"))) < 4 and time.monotonic() < deadline:
        shown = subprocess.run(["scontrol", "show", "job", job_id], env=cluster.env(), capture_output=True, text=True, timeout=10).stdout or shown
        pending = "Restarts=1" in shown and "JobState=PENDING" in shown
        pending_since = (pending_since or time.monotonic()) if pending else None
        # Slurm holds a requeued job back for ~2 minutes and may set that delay after an earlier
        # update, so repeat it while the job is pending; but not in the first seconds: a job
        # started again at once finds its old credential still revoked on the nodes, and Slurm
        # kills it ("Killing non-startable batch job: Job credential revoked").
        if pending and time.monotonic() - pending_since > 5 and time.monotonic() - last_hurry > 2:
            subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=cluster.env(), timeout=10, check=False)
            last_hurry = time.monotonic()
        time.sleep(0.5)
    # Said in full when it fails: a requeued job that never starts again is Slurm's state
    # (pending reason, drained node) as much as ours.
    nodes = subprocess.run(["sinfo", "-N", "-o", "%N %T %E"], env=cluster.env(), capture_output=True, text=True, timeout=10).stdout
    why = f"{shown}\n{nodes}\n{out.read_text()[-3000:]}"
    assert sorted(p.name for p in markers.glob("*.preempted")) == [f"rank{r}.preempted" for r in range(4)], why
    assert sorted(p.name for p in markers.glob("*.resumed")) == [f"rank{r}.resumed" for r in range(4)], why
    assert cluster.wait_job(job_id) == "COMPLETED"
    shown = subprocess.run(["scontrol", "show", "job", job_id], env=cluster.env(), capture_output=True, text=True, timeout=10).stdout
    assert "Restarts=1" in shown
    # Both runs are in the summary: the first wrote it before it requeued the job (which ends it).
    data = json.loads(summary.read_text())
    assert data["job"] == f"slurm {job_id}" and len(data["runs"]) == 2 and data["job_goodput"]["runs"] == 2, data


@pytest.mark.parametrize("per_node", [1, 2])
def test_scancel_ends_every_worker_on_every_node(cluster: Cluster, job_dir: Path, per_node: int) -> None:
    compute = ROOT / "tests" / "fixtures" / "compute.py"
    nproc = ["--nproc-per-node", "2"] if per_node == 1 else []  # per node: hpctorch's agent; per task: srun's tasks
    script = job_dir / "job.sh"
    script.write_text(f"#!/bin/sh\nsrun {' '.join(HPCTORCH)} run {' '.join(nproc)} {compute} --seconds 300\n")
    out = job_dir / "out.txt"
    submitted = cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), "sbatch", "--parsable", "-N2",
                                      f"--ntasks-per-node={per_node}", "-o", str(out), str(script)], timeout=30)
    job_id = submitted.stdout.strip()
    deadline = time.monotonic() + 120
    while (not out.exists() or out.read_text().count("READY") < 4) and time.monotonic() < deadline:
        time.sleep(0.5)
    pids = [int(p) for p in re.findall(r"READY rank=\d+ pid=(\d+)", out.read_text())]
    assert len(pids) == 4, out.read_text()[-2000:]
    if per_node == 1:
        _watching_without_torch(pids)
    cancelled = subprocess.run(["scancel", job_id], env=cluster.env(), capture_output=True, text=True, timeout=30)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cluster.wait_job(job_id, timeout=120) == "CANCELLED"
    deadline = time.monotonic() + 30  # a hang guard: Slurm's KillWait is 5 s
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()], "workers outlived scancel"
    if per_node == 1:
        # Node 0 says it at once; its closing line ("stopped by SIGTERM") comes after the stacks and
        # the workers' stop, which a loaded machine can stretch past this cluster's KillWait of 5 s.
        assert "hpctorch: SIGTERM received: the workers' stacks, then the workers are stopped" in out.read_text(), out.read_text()[-2000:]


def _watching_without_torch(workers: list[int]) -> None:
    """Every node's watchdog helper (a child of the hpctorch beside these workers) reaches the
    watchdog's store without importing torch: node 0's hpctorch, which imported torch to serve the
    master port, serves that store too. Read once each helper holds its connection to the store
    (after the import it would have made to serve it)."""
    import psutil

    def helpers() -> list[psutil.Process]:
        """The helpers beside the workers' hpctorch: their nearest ancestor with one (the workers
        are its children, or its zygote's)."""
        found: dict[int, psutil.Process] = {}
        for worker in workers:
            for ancestor in psutil.Process(worker).parents():
                beside = []
                for child in ancestor.children():
                    try:
                        if "hpctorch.guard.nodewatch" in " ".join(child.cmdline()):
                            beside.append(child)
                    except psutil.NoSuchProcess:  # a probe that ended meanwhile
                        continue
                if beside:
                    found.update((helper.pid, helper) for helper in beside)
                    break
        return list(found.values())

    deadline = time.monotonic() + 120  # a hang guard
    while True:
        watching = helpers()
        connected = [h for h in watching if _established(h.pid)]
        if len(watching) == 2 and len(connected) == 2:
            break
        assert time.monotonic() < deadline, f"{len(watching)} helpers, {len(connected)} connected to the watchdog's store"
        time.sleep(0.2)
    assert [any("libtorch" in m.path for m in h.memory_maps()) for h in watching] == [False, False]


def _established(pid: int) -> bool:
    """Whether ``pid`` holds an established TCP connection, read in its own network namespace
    (psutil reads the caller's /proc/net/tcp)."""
    import os

    try:
        sockets = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        table = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    except OSError:  # it ended meanwhile
        return False
    return any(fields[3] == "01" and f"socket:[{fields[9]}]" in sockets for fields in (line.split() for line in table))


@pytest.mark.parametrize("layout", [["--nproc-per-node", "2"], ["--cpus-per-node", "1"], ["--preempt-signal", "USR1@60", "--requeue"],
                                    ["--gpus-per-node", "2"], ["--gpus-per-node", "2", "--nproc-per-node", "1", "--cpus-per-node", "2"]])
def test_every_slurm_script_submit_writes_passes_sbatch_test_only(cluster: Cluster, job_dir: Path, layout: list[str]) -> None:
    script = job_dir / "job.sh"
    written = cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), *HPCTORCH, "submit", "--scheduler", "slurm",
                                    "--nodes", "2", "--time", "5", "--job-script", str(script), "--dry-run", *layout, TOY])
    assert written.returncode == 0, written.stderr
    script.write_text(written.stdout)
    checked = cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), "sbatch", "--test-only", str(script)], timeout=30)
    assert checked.returncode == 0 and "to start at" in checked.stderr, checked.stderr


def test_arbitrary_distribution_masters_on_the_node_of_task_0(cluster: Cluster, job_dir: Path) -> None:
    # srun -m arbitrary: task 0 on node2, although Slurm's sorted node list starts with node1.
    hosts = job_dir / "hosts"
    hosts.write_text("node2\nnode1\n")
    done = cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), "srun", "-m", "arbitrary", "-n2", "--kill-on-bad-exit=1",
                                 *HPCTORCH, "run", "--nproc-per-node", "2", TOY, "--steps", "6"], SLURM_HOSTFILE=str(hosts))
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = toy_ranks(done.stdout)
    assert sorted(int(r["rank"]) for r in ranks) == [0, 1, 2, 3], done.stdout[-2000:]
    for r in ranks:  # node rank 0 is node2, holding ranks 0-1; one master, on node2's fabric address
        assert r["host"] == ("node2" if int(r["rank"]) < 2 else "node1") and r["master"].startswith("198.18.0.2:"), r
    assert "done world=4" in done.stdout


@pytest.mark.parametrize("layout, per_node, prefixed, gpus", [
    (["--nproc-per-node", "2"], 2, False, ["-", "-"]),
    ([], 1, True, ["-"]),
    # The harness's stand-in GPUs (Slurm GRES, see Cluster._gpu_devices): Slurm binds them.
    (["--gpus-per-node", "2"], 2, False, ["0", "1"]),
    (["--gpus-per-node", "2", "--nproc-per-node", "1"], 1, True, ["0,1"]),
])
def test_a_script_submit_writes_runs_as_written(cluster: Cluster, job_dir: Path, layout: list[str], per_node: int, prefixed: bool,
                                                gpus: list[str]) -> None:
    # --nproc-per-node 2: every rank a Slurm task (per task); nothing given: one task per node
    # (per node); --gpus-per-node 2: a task per GPU, Slurm binding one to each; with one rank
    # per node, one task per node with both GPUs.
    submitted = cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), *HPCTORCH, "submit", "--scheduler", "slurm",
                                      "--nodes", "2", "--time", "5", *layout, TOY, "--steps", "6"], timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job_id = re.search(r"submitted slurm job (\d+)", submitted.stdout).group(1)  # type: ignore[union-attr]
    assert cluster.wait_job(job_id) == "COMPLETED"
    output = (job_dir / f"hpctorch-hpctorch-{job_id}.out").read_text()
    assert_trained_across_nodes(output, per_node=per_node)
    # Neither started by torch's agent (per task hpctorch execs each rank; per node it starts them
    # itself); only hpctorch per node prefixes each line with its rank.
    assert {r["agent"] for r in toy_ranks(output)} == {"none"}
    assert bool(re.search(r"^\[\S+ rank 0\]: ", output, re.M)) == prefixed, output[-2000:]
    for node in ("node1", "node2"):  # each rank sees its own GPUs, as Slurm granted them
        assert sorted(r["gpus"] for r in toy_ranks(output) if r["host"] == node) == gpus, output[-2000:]


def test_a_requeued_job_leaves_the_bad_nodes_out(cluster: Cluster, job_dir: Path) -> None:
    """run --requeue: before it requeues, node 0 puts the user's bad nodes in the job's
    ExcNodeList (scontrol update), read back from Slurm here."""
    markers = job_dir / "markers"
    markers.mkdir()
    bad = job_dir / "bad-nodes.jsonl"
    bad.write_text(json.dumps({"node": "node2", "reason": "test", "time": time.time(), "job": None}) + "\n")
    preemptible = str(Path(TOY).parent.parent / "tests" / "fixtures" / "preemptible.py")
    script = job_dir / "job.sh"
    script.write_text(f"#!/bin/sh\nexport HPCTORCH_BAD_NODES={bad}\n"
                      f"srun {' '.join(HPCTORCH)} run --requeue --nproc-per-node 1 {preemptible} --markers {markers}\n")
    out = job_dir / "out.txt"
    submitted = cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), "sbatch", "--parsable", "--requeue", "-N1",
                                      "-w", "node1", "--open-mode=append", "-o", str(out), str(script)], timeout=30)
    job_id = submitted.stdout.strip()
    try:
        deadline = time.monotonic() + 120
        while (not out.exists() or "READY" not in out.read_text()) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "READY" in out.read_text(), out.read_text()[-2000:]
        subprocess.run(["scancel", "--signal=USR1", job_id], env=cluster.env(), check=True, timeout=30)
        deadline = time.monotonic() + 120
        shown = ""
        while "Restarts=1" not in shown and time.monotonic() < deadline:
            shown = subprocess.run(["scontrol", "show", "job", job_id], env=cluster.env(), capture_output=True, text=True, timeout=10).stdout
            time.sleep(0.5)
        assert "Restarts=1" in shown and "ExcNodeList=node2" in shown, shown + out.read_text()[-2000:]
        # The line travels through slurmstepd and srun after Slurm shows the change: waited for.
        while "requeued; bad nodes left out" not in out.read_text() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "requeued; bad nodes left out: node2" in out.read_text(), out.read_text()[-2000:]
    finally:
        subprocess.run(["scancel", job_id], env=cluster.env(), timeout=30, check=False)


def test_submit_leaves_out_only_the_bad_nodes_slurm_has(cluster: Cluster, job_dir: Path) -> None:
    """A bad-node list on a home shared by several clusters holds other clusters' nodes; Slurm
    refuses a job whose --exclude names a node it does not have ("Invalid node name specified")."""
    listed = job_dir / "bad-nodes.jsonl"
    added = cluster.run("node1", [*HPCTORCH, "badnodes", "add", "nid99999,node2", "--reason", "test"], HPCTORCH_BAD_NODES=str(listed))
    assert added.returncode == 0, added.stderr
    script = job_dir / "job.sh"
    written = cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), *HPCTORCH, "submit", "--scheduler", "slurm",
                                    "--nodes", "1", "--time", "5", "--dry-run", TOY], HPCTORCH_BAD_NODES=str(listed))
    assert written.returncode == 0, written.stderr
    assert "--exclude=node2" in written.stdout and "nid99999" not in written.stdout, written.stdout
    assert "1 more on the list are not slurm's nodes here" in written.stderr, written.stderr
    script.write_text(written.stdout)
    checked = cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), "sbatch", "--test-only", str(script)], timeout=30)
    assert checked.returncode == 0 and "to start at" in checked.stderr, checked.stderr

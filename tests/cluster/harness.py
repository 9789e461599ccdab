"""A real cluster on one machine: network namespaces as nodes, real Slurm and MPI.

Each node ``nodeN`` is a network namespace ``hpct-nodeN`` with
- ``hsn0``  198.18.0.N/24 on a bridge shared by all nodes (the fabric), and
- ``mgmt0`` 198.19.0.N/24 on a veth whose peer joins nothing (unreachable), which
  the node's host name resolves to through /etc/hosts: the classic trap where the
  default address is wrong and only a deliberate interface choice works.
munged and slurmctld run in the root namespace (bridge address 198.18.0.254),
one slurmd per node namespace under its own UTS namespace (host name nodeN).

Everything created is named with the ``hpct`` prefix or marked in /etc/hosts, and
``down()`` removes exactly that, by pid file and by name, also after a failure.
By hand: ``python -m tests.cluster up|down|status``.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import IO
from pathlib import Path

PREFIX = "hpct"
BRIDGE = f"{PREFIX}br0"
BRIDGE_ADDR = "198.18.0.254"
HOSTS_MARK = "# hpctorch-test-cluster"
STATE_DIR = Path(os.environ.get("HPCTORCH_CLUSTER_DIR", "/tmp/hpctorch-cluster"))
MAX_NODES = 4
GPUS_PER_NODE = 2
"""Stand-in GPUs per node for Slurm's GRES (see Cluster._gpu_devices)."""


def fabric_addr(index: int) -> str:
    return f"198.18.0.{index}"


def mgmt_addr(index: int) -> str:
    return f"198.19.0.{index}"


def _sh(*argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def missing_requirements() -> list[str]:
    """What this machine lacks to build the cluster (empty when it can)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root")
    for tool in ("ip", "nsenter", "unshare", "munged", "mungekey", "slurmctld", "slurmd", "srun", "sbatch", "mpirun.openmpi", "mpiexec.hydra"):
        if shutil.which(tool) is None:
            missing.append(tool)
    if not missing:
        probe = _sh("ip", "netns", "add", f"{PREFIX}-probe", check=False)
        if probe.returncode != 0:
            missing.append(f"network namespaces ({probe.stderr.strip()})")
        else:
            _sh("ip", "netns", "delete", f"{PREFIX}-probe", check=False)
    return missing


@contextmanager
def turn(state_dir: Path, exclusive: bool, timeout: float = 1800) -> Iterator[None]:
    """The cluster held, across the test processes that share it: shared by a test, alone by one
    that disturbs the nodes. An exclusive holder waits with the gate (turnstile) shut, so a stream
    of shared holders cannot keep it out. The limit is a hang guard, far above one test's time."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / "turnstile.lock", "a+") as gate, open(state_dir / "cluster.lock", "a+") as held:
        _flock(gate, fcntl.LOCK_EX, timeout)
        try:
            _flock(held, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, timeout)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


def _flock(handle: IO[str], how: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(handle, how | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"another test process held the test cluster ({handle.name}) for {timeout:.0f} s") from None
            time.sleep(0.1)


class Cluster:
    """Build, use and tear down an N-node cluster."""

    def __init__(self, nodes: int = 2, state_dir: Path = STATE_DIR, extra: int = 1) -> None:
        """``nodes`` make the default partition (``debug``) that tests use unless they say
        otherwise; ``extra`` more join them in the ``wide`` partition, for the tests that need
        a third node (the screen's judgement against a median)."""
        if not 1 <= nodes + extra <= MAX_NODES:
            raise ValueError(f"1..{MAX_NODES} nodes")
        self.count = nodes
        self.dir = state_dir
        self.names = [f"node{i}" for i in range(1, nodes + 1)]
        self.all_names = [f"node{i}" for i in range(1, nodes + extra + 1)]
        self.conf = self.dir / "slurm.conf"
        self._lists = 0

    # ---- using the nodes -------------------------------------------------
    def netns(self, node: str) -> str:
        return f"{PREFIX}-{node}"

    def on(self, node: str, argv: Sequence[str]) -> list[str]:
        """argv that runs ``argv`` on ``node``: its network and its host name.

        The host name is set inside a fresh UTS namespace; ``argv`` travels as
        positional parameters, never through a shell string.
        """
        return [
            "nsenter", f"--net=/var/run/netns/{self.netns(node)}",
            "unshare", "--uts", "--",
            "sh", "-c", 'hostname "$0" && exec "$@"', node, *argv,
        ]

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI", "HPCTORCH_"))}
        env["SLURM_CONF"] = str(self.conf)
        # Each command's jobs keep their own bad-node list (unless the test names one): a node one
        # job named (a straggler, a screen) must not leave the next test's job without nodes.
        self._lists += 1
        env["HPCTORCH_BAD_NODES"] = str(self.dir / f"bad-nodes-{os.getpid()}-{self._lists}.jsonl")  # test processes share the cluster
        env.update(extra)
        return env

    def run(self, node: str, argv: Sequence[str], timeout: float = 300, **extra_env: str) -> subprocess.CompletedProcess:
        return subprocess.run(self.on(node, argv), capture_output=True, text=True, timeout=timeout, env=self.env(**extra_env))

    def sbatch(self, job_dir: Path, script: Path, *options: str, timeout: float = 240) -> tuple[str, str]:
        """Submit from node1 (the login node), wait for the end: (final state, output)."""
        out = job_dir / "out.txt"
        submit = self.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), "sbatch", "--parsable", "-o", str(out), *options, str(script)], timeout=30)
        if submit.returncode != 0:
            raise RuntimeError(f"sbatch failed: {submit.stderr.strip()}")
        job_id = submit.stdout.strip().split(";")[0]
        return self.wait_job(job_id, timeout), out.read_text() if out.exists() else ""

    def wait_job(self, job_id: str, timeout: float = 240) -> str:
        """Poll until the job ends (faster than sbatch --wait); its final state."""
        deadline = time.monotonic() + timeout
        state = "UNKNOWN"
        while time.monotonic() < deadline:
            shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, env=self.env(), timeout=10).stdout
            state = shown.split("JobState=", 1)[1].split()[0] if "JobState=" in shown else "UNKNOWN"
            if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "UNKNOWN"):
                return state
            time.sleep(0.1)
        subprocess.run(["scancel", job_id], env=self.env(), timeout=10, check=False)
        return f"TIMEOUT ({state})"

    def mpirun(self, per_node: int, argv: Sequence[str], mpirun: str = "mpirun.openmpi") -> list[str]:
        """An OpenMPI command line over every node, ``per_node`` ranks each, started by
        the ssh stand-in that enters each node's namespace."""
        hosts = ",".join(f"{node}:{per_node}" for node in self.names)
        return [
            mpirun, "--allow-run-as-root", "--oversubscribe", "-H", hosts, "-np", str(per_node * self.count),
            "--mca", "plm_rsh_agent", str(self.dir / "rsh-agent"),
            "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "198.18.0.0/24",
            "--mca", "oob_tcp_if_include", "198.18.0.0/24", *argv,
        ]

    def hydra(self, per_node: int, argv: Sequence[str]) -> list[str]:
        """An MPICH (Hydra) command line over every node, ``per_node`` ranks each: its ssh
        launcher is the stand-in that enters each node's namespace; proxies and ranks
        connect back over the fabric (the management network does not route between nodes)."""
        return [
            "mpiexec.hydra", "-launcher", "ssh", "-launcher-exec", str(self.dir / "rsh-agent"), "-iface", "hsn0",
            "-hosts", ",".join(self.names), "-np", str(per_node * self.count), "-ppn", str(per_node), *argv,
        ]

    # ---- life cycle ------------------------------------------------------
    def up(self) -> "Cluster":
        self.down()
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            self._network()
            self._hosts()
            self._munge()
            self._slurm()
            self._rsh_agent()
        except BaseException:
            self.down()
            raise
        return self

    def _network(self) -> None:
        _sh("ip", "link", "add", BRIDGE, "type", "bridge")
        _sh("ip", "addr", "add", f"{BRIDGE_ADDR}/24", "dev", BRIDGE)
        _sh("ip", "link", "set", BRIDGE, "up")
        for index, node in enumerate(self.all_names, start=1):
            ns = self.netns(node)
            _sh("ip", "netns", "add", ns)
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            for kind, addr, bridged in (("f", fabric_addr(index), True), ("m", mgmt_addr(index), False)):
                host_end, node_end = f"{PREFIX}{kind}{index}h", f"{PREFIX}{kind}{index}n"
                name = "hsn0" if kind == "f" else "mgmt0"
                _sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", node_end)
                _sh("ip", "link", "set", node_end, "netns", ns)
                _sh("ip", "-n", ns, "link", "set", node_end, "name", name)
                _sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", name)
                _sh("ip", "-n", ns, "link", "set", name, "up")
                if bridged:
                    _sh("ip", "link", "set", host_end, "master", BRIDGE)
                _sh("ip", "link", "set", host_end, "up")

    def _hosts(self) -> None:
        # Names resolve to the unreachable management net (the trap); the fabric
        # addresses get names of their own so reverse lookups of them succeed.
        lines = [f"{mgmt_addr(i)} {node} {HOSTS_MARK}\n" for i, node in enumerate(self.all_names, start=1)]
        lines += [f"{fabric_addr(i)} {node}-hsn0 {HOSTS_MARK}\n" for i, node in enumerate(self.all_names, start=1)]
        with open("/etc/hosts", "a", encoding="utf-8") as hosts:
            hosts.writelines(lines)

    def _munge(self) -> None:
        munge_dir = self.dir / "munge"
        munge_dir.mkdir(exist_ok=True)
        key = munge_dir / "munge.key"
        if not key.exists():
            _sh("mungekey", "--create", f"--keyfile={key}")
        os.chmod(key, 0o600)
        _sh(
            "munged", "--force", f"--key-file={key}", f"--socket={munge_dir / 'munge.socket'}",
            f"--pid-file={munge_dir / 'munged.pid'}", f"--log-file={munge_dir / 'munged.log'}",
            f"--seed-file={munge_dir / 'munged.seed'}",
        )

    def _slurm(self) -> None:
        host = socket.gethostname()
        d = self.dir
        (d / "state").mkdir(exist_ok=True)
        total = len(self.all_names)
        nodes = f"node[1-{self.count}]" if self.count > 1 else "node1"
        every = f"node[1-{total}]" if total > 1 else "node1"
        addrs = ",".join(fabric_addr(i) for i in range(1, total + 1))
        cpus = os.cpu_count() or 2
        gpus = self._gpu_devices()
        self.conf.write_text(
            f"""ClusterName=hpct
SlurmctldHost={host}({BRIDGE_ADDR})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d / 'munge' / 'munge.socket'}
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# A batch job is scheduled at the next tick, not up to batch_sched_delay (3 s) later: ~90 jobs a suite.
SchedulerParameters=batch_sched_delay=0
ReturnToService=2
StateSaveLocation={d / 'state'}
SlurmdSpoolDir={d / 'spool-%n'}
SlurmctldPidFile={d / 'slurmctld.pid'}
SlurmdPidFile={d / 'slurmd-%n.pid'}
SlurmctldLogFile={d / 'slurmctld.log'}
SlurmdLogFile={d / 'slurmd-%n.log'}
SlurmctldPort=6817
SlurmdPort=6818
KillWait=5
MinJobAge=30
InactiveLimit=0
GresTypes=gpu
NodeName={every} NodeAddr={addrs} CPUs={cpus} Gres=gpu:{len(gpus)} State=UNKNOWN
PartitionName=debug Nodes={nodes} Default=YES MaxTime=60 State=UP OverSubscribe=FORCE:8
PartitionName=wide Nodes={every} MaxTime=60 State=UP OverSubscribe=FORCE:8
"""
        )
        (d / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        (d / "gres.conf").write_text(f"AutoDetect=off\nNodeName={every} Name=gpu File={','.join(str(g) for g in gpus)}\n")
        env = self.env()
        subprocess.run(["slurmctld", "-f", str(self.conf)], check=True, env=env, timeout=30, capture_output=True)
        for node in self.all_names:
            subprocess.run(self.on(node, ["slurmd", "-N", node, "-f", str(self.conf)]), check=True, env=env, timeout=30, capture_output=True)
        self._wait_idle()

    def _gpu_devices(self) -> list[Path]:
        """GPUS_PER_NODE stand-in GPU device files (NVIDIA's character major 195, no driver behind
        them): Slurm's gres/gpu plugin then grants GPUs and sets CUDA_VISIBLE_DEVICES per task,
        as on a GPU cluster; opening one fails (ENXIO), so nothing here can use it by mistake."""
        dev = self.dir / "dev"
        dev.mkdir(exist_ok=True)
        paths = []
        for index in range(GPUS_PER_NODE):
            path = dev / f"nvidia{index}"
            if not path.exists():
                os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(195, index))
            paths.append(path)
        return paths

    def _rsh_agent(self) -> None:
        # mpirun calls its agent like ssh: AGENT [options] HOST COMMAND WORDS...; like
        # sshd, the stand-in hands the joined words to a shell, on HOST's namespace.
        agent = self.dir / "rsh-agent"
        agent.write_text(
            "#!/bin/sh\n"
            'while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done\n'
            'host="$1"; shift\n'
            f'exec nsenter --net=/var/run/netns/{PREFIX}-"$host" unshare --uts -- '
            """sh -c 'hostname "$0" && exec sh -c "$*"' "$host" "$@"\n"""
        )
        agent.chmod(0o755)

    def _wait_idle(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        states = ""
        while time.monotonic() < deadline:
            done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, env=self.env(), timeout=10)
            states = done.stdout.strip()
            seen = dict(line.split()[:2] for line in states.splitlines() if len(line.split()) >= 2)  # a node per partition
            if len(seen) == len(self.all_names) and all(state == "idle" for state in seen.values()):
                return
            time.sleep(0.5)
        raise RuntimeError(f"Slurm nodes not idle after {timeout:.0f} s: {states!r}; see {self.dir}/*.log")

    def down(self) -> None:
        """Remove everything this harness may have created; safe to call twice."""
        from .gridengine import stop_daemons

        stop_daemons()  # a Grid Engine cell on node1, if a test left one running
        for pidfile in sorted(self.dir.glob("slurmd-*.pid")) + [self.dir / "slurmctld.pid", self.dir / "munge" / "munged.pid"]:
            _kill_by_pidfile(pidfile)
        _kill_jobs_left(self.conf)
        for spool in self.dir.glob("spool-*"):
            # A job's state left there made the next cluster's slurmd report it ("Orphan StepId"),
            # and the new job of the same id drained the node ("Duplicate jobid").
            shutil.rmtree(spool, ignore_errors=True)
        listed = _sh("ip", "netns", "list", check=False).stdout.split()
        for ns in listed:
            if ns.startswith(f"{PREFIX}-"):
                _sh("ip", "netns", "delete", ns, check=False)
        links = _sh("ip", "-o", "link", "show", check=False).stdout
        for line in links.splitlines():
            name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
            if name.startswith(PREFIX):
                _sh("ip", "link", "delete", name, check=False)
        try:
            with open("/etc/hosts", encoding="utf-8") as hosts:
                kept = [line for line in hosts if HOSTS_MARK not in line]
            with open("/etc/hosts", "w", encoding="utf-8") as hosts:
                hosts.writelines(kept)
        except OSError:
            pass
        if (self.dir / "state").exists():
            shutil.rmtree(self.dir / "state", ignore_errors=True)


def _kill_jobs_left(conf: Path) -> None:
    """SIGKILL every process still running on a node of this cluster: another network namespace
    than this process's, and this cluster's SLURM_CONF in its environment (every job's process,
    slurmstepd included, which outlives slurmd and its namespace's name)."""
    here = os.readlink("/proc/self/ns/net")
    mark = f"SLURM_CONF={conf}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/ns/net") == here:
                continue
            with open(f"/proc/{pid}/environ", "rb") as source:
                if mark in source.read().split(bytes(1)):
                    os.kill(int(pid), signal.SIGKILL)
        except OSError:
            continue


def _kill_by_pidfile(pidfile: Path, grace: float = 5.0) -> None:
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pidfile.unlink(missing_ok=True)
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    pidfile.unlink(missing_ok=True)

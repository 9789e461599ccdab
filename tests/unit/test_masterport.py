"""A held master port moves the job to the next of its ports (start/masterport): the ports are the
same on every node; node 0 serves on the first it can bind, the others join the first store that
authenticates as this job's node 0 (a squatter's store is passed over). Real torch TCPStores."""

from __future__ import annotations

import datetime
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from hpctorch.errors import HpctorchError
from hpctorch.guard import authority
from hpctorch.host.network import free_port
from hpctorch.plan.types import Plan
from hpctorch.schedulers import job_port
from hpctorch.start import masterport


def _plan(node: int, ports: tuple[int, ...], timeout: int = 30) -> Plan:
    return Plan(mode="per-node", scheduler="slurm", job_id="42", nodes=("n1", "n2"), node_rank=node, nproc_per_node=(1, 1),
                master_addr="127.0.0.1", master_port=ports[0], rdzv_backend="static", rdzv_timeout=timeout, run_id="slurm-42",
                iface="lo", simulated=False, max_restarts=0, workers=(), common_env={}, master_ports=ports, watch_port=1,
                reasons={"master_port": "derived from job id 42"})


@pytest.fixture(autouse=True)
def own_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(authority, "_made", {})
    yield
    masterport.release()


def test_every_node_derives_the_same_ports_and_jobs_differ() -> None:
    ports = job_port.port_sequence("4242", "0")
    assert len(ports) == job_port.PORT_TRIES == len(set(ports)) and ports[0] == job_port.derive_port("4242", "0")
    assert all(job_port.PORT_BASE <= p < job_port.PORT_BASE + job_port.PORT_SPAN for p in ports)
    elsewhere = subprocess.run([sys.executable, "-c", "from hpctorch.schedulers.job_port import port_sequence as s; print(s('4242', '0'))"],
                               capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    assert elsewhere == str(ports)  # another process (another node): no seeded hash
    assert job_port.port_sequence("4243", "0") != ports and job_port.port_sequence("4242", "1") != ports


def test_a_squatters_store_on_the_first_port_is_passed_over_by_every_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from torch.distributed import TCPStore

    first = free_port()
    squatter = TCPStore("127.0.0.1", first, None, True, datetime.timedelta(seconds=10), wait_for_workers=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "squatter"))
    authority.publish(squatter, _plan(0, (first,)))  # the genuine hpctorch, run by someone else as "node 0"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(authority, "_made", {})
    ports = (first, free_port(), free_port())

    node0 = masterport.settle(_plan(0, ports))
    assert node0.master_port == ports[1] and node0.watch_port not in (0, 1)
    assert "the next of the job's ports" in node0.reasons["master_port"]
    err = capsys.readouterr().err
    assert f"hpctorch: master port {first} (held by a process of your own): serving on {ports[1]}" in err, err

    node1 = masterport.settle(_plan(1, ports))
    assert (node1.master_port, node1.watch_port) == (node0.master_port, node0.watch_port)
    # Its store is node 0's: a record node 0 seals there opens for node 1.
    from hpctorch.guard.agreement import open_store

    sealed0 = authority.sealed(open_store(node0, 10), node0, 10, serve=True)
    sealed0.set("hpctorch/slurm-42/x", "from node 0")
    assert authority.sealed(open_store(node1, 10), node1, 10, serve=False).get("hpctorch/slurm-42/x") == b"from node 0"
    del squatter


def test_with_no_node_0_anywhere_the_wait_ends_in_one_line_naming_each_port() -> None:
    ports = (free_port(), free_port())
    started = time.monotonic()
    with pytest.raises(HpctorchError) as raised:
        masterport.settle(_plan(1, ports, timeout=2))
    assert time.monotonic() - started < 30  # a hang guard: the timeout is 2 s
    assert raised.value.cause.startswith(f"could not reach the master's store at 127.0.0.1:{ports[0]} (nor the job's other "
                                         f"ports, {ports[1]}) from lo within 2 s: connection refused"), raised.value.cause


def test_a_port_given_by_the_user_has_no_alternates() -> None:
    from hpctorch import Options, make_plan
    from hpctorch.schedulers import detect

    from .helpers import facts

    env = {"SLURM_JOB_ID": "51", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_STEP_NODELIST": "node[1-2]",
           "SLURM_NNODES": "2", "SLURM_STEP_NUM_NODES": "2", "SLURM_NODEID": "1", "SLURM_PROCID": "1", "SLURM_NTASKS": "2",
           "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_LOCALID": "0"}
    derived = make_plan(detect(env), Options(master_addr="127.0.0.1", command=("x",)), facts())
    assert derived.master_ports == job_port.port_sequence("51", "0") and derived.master_port == derived.master_ports[0]
    assert derived.reasons["master_ports"].startswith("derived alike: if the port is held on node 0")
    assert masterport.applies(derived)
    given = make_plan(detect(env), Options(master_addr="127.0.0.1", master_port=29500, command=("x",)), facts())
    assert given.master_ports == () and "master_ports" not in given.reasons and not masterport.applies(given)
    # torch's c10d rendezvous (--max-restarts) reuses the store node 0's hpctorch opens first: the same ports, found
    # the same way, where node 0 hosts it; not where the user chose which node hosts it.
    restarts = make_plan(detect(env), Options(master_addr="127.0.0.1", max_restarts=1, command=("x",)), facts())
    assert restarts.rdzv_backend == "c10d" and restarts.master_ports == job_port.port_sequence("51", "0")
    assert masterport.applies(restarts)
    chosen = make_plan(detect(env), Options(master_addr="127.0.0.1", max_restarts=1, rdzv_conf={"is_host": "false"}, command=("x",)),
                       facts())
    assert not masterport.applies(chosen)


def test_rank_0_takes_the_port_over_under_the_same_seal(tmp_path: Path) -> None:
    """hpctorch's starter: node 0's hpctorch serves until its rank 0 (another process) asks for the
    port, then lets go; rank 0 serves there under the same seal, so a node that read either trusts both."""
    import os

    ports = (free_port(), free_port())
    node0 = masterport.settle(_plan(0, ports))
    assert masterport.held() and node0.master_port == ports[0]
    folder = tmp_path / "node"
    folder.mkdir(mode=0o700)
    env = {**os.environ, **masterport.hand_over(str(folder), node0.run_id, 60)}
    (tmp_path / "plan.json").write_text(node0.to_json())
    rank0 = subprocess.Popen([sys.executable, "-c", (
        "import json, sys\n"
        "from hpctorch.guard import agreement, authority\n"
        "from hpctorch.plan.types import Plan\n"
        f"plan = Plan.from_dict(json.load(open({str(tmp_path / 'plan.json')!r})))\n"
        "store = agreement.ask_for_port(lambda: agreement.open_store(plan, 10), 30)\n"
        "authority.sealed(store, plan, 10, serve=True).set('hpctorch/slurm-42/x', 'from rank 0')\n"
        "print('served', flush=True)\n"
        "sys.stdin.read()\n")], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert rank0.stdout is not None and rank0.stdout.readline().strip() == "served"
        assert not masterport.held()  # let go once asked
        node1 = masterport.settle(_plan(1, ports))
        assert node1.master_port == ports[0]
        from hpctorch.guard.agreement import open_store

        seal = authority.verify(open_store(node1, 10), node1, 10)
        assert seal.tag("k", b"v") == authority.node0_seal(node0.run_id).tag("k", b"v")  # one seal, both processes
        assert authority.sealed(open_store(node1, 10), node1, 10, serve=False).get("hpctorch/slurm-42/x") == b"from rank 0"
        assert sorted(os.listdir(folder)) == ["port-asked", "run-secret"]
        assert os.stat(folder / "run-secret").st_mode & 0o077 == 0
    finally:
        rank0.kill()
        rank0.wait(timeout=30)


def test_a_node_that_meets_the_port_handed_over_joins_rank_0s_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Node 1 connects to node 0's hpctorch's store just before it lets go of the port (rank 0 asked
    for it): the connection closes while node 1 waits for the authority record. That is no
    verdict: node 1 reaches rank 0's store at the next poll and the agreement ends (on the test
    cluster it ended the job once: 'gave no hpctorch authority record ... not this job's node 0')."""
    import os

    from hpctorch.guard import agreement

    ports = (free_port(), free_port())
    node0 = masterport.settle(_plan(0, ports))
    folder = tmp_path / "node"
    folder.mkdir(mode=0o700)
    env = {**os.environ, **masterport.hand_over(str(folder), node0.run_id, 60)}
    (tmp_path / "plan.json").write_text(node0.to_json())
    started: list[subprocess.Popen] = []
    real_verify = authority.verify

    def verify_once_handed_over(store, plan, timeout_s):  # type: ignore[no-untyped-def]
        if not started:  # node 1 holds a client of hpctorch's store: now rank 0 asks for the port
            started.append(subprocess.Popen([sys.executable, "-c", (
                "import json, sys\n"
                "from hpctorch.guard import agreement\n"
                "from hpctorch.plan.types import Plan\n"
                f"plan = Plan.from_dict(json.load(open({str(tmp_path / 'plan.json')!r})))\n"
                "store = agreement.check(plan, 60)\n"  # rank 0's store: it serves the job from here on
                "print('agreed', flush=True)\n"
                "sys.stdin.read()\n")], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
            deadline = time.monotonic() + 60  # a hang guard
            while masterport.held() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert not masterport.held()
        return real_verify(store, plan, timeout_s)

    monkeypatch.setattr(authority, "verify", verify_once_handed_over)
    try:
        assert agreement.check(replace(_plan(1, ports), master_port=node0.master_port), 60) is None
        assert started[0].stdout is not None and started[0].stdout.readline().strip() == "agreed"
    finally:
        for process in started:
            process.kill()
            process.wait(timeout=30)


def test_another_node_finds_node_0_without_importing_torch(tmp_path: Path) -> None:
    """Its hpctorch must not import torch from the shared path before staging (thousands of file
    system calls per node), nor spend a second on it before its workers start."""
    import os

    ports = (free_port(), free_port())
    node0 = masterport.settle(_plan(0, ports))
    (tmp_path / "plan.json").write_text(_plan(1, ports).to_json())
    found = subprocess.run([sys.executable, "-c", (
        "import json, sys\n"
        "from hpctorch.plan.types import Plan\n"
        "from hpctorch.start import masterport\n"
        f"plan = masterport.settle(Plan.from_dict(json.load(open({str(tmp_path / 'plan.json')!r}))))\n"
        "print(plan.master_port, 'torch' in sys.modules)\n")], env={**os.environ}, capture_output=True, text=True, timeout=120)
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == [str(node0.master_port), "False"], found.stdout + found.stderr

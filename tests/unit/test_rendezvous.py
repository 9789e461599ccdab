"""The shared-file exchange of the master's address."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from hpctorch import Options, make_plan
from hpctorch.errors import HpctorchError
from hpctorch.plan.render import table
from hpctorch.plan.rendezvous import read_master, write_master
from hpctorch.schedulers import slurm
from hpctorch.schedulers.allocation import Allocation

from .helpers import LO, MGMT, facts, iface

TRAP = {"node1": ("198.19.0.1",)}  # node1's name resolves to the management net


def plans(tmp_path: Path, timeout: int = 10, master_addr: str | None = None):  # type: ignore[no-untyped-def]
    def at(node: int):  # type: ignore[no-untyped-def]
        allocation = Allocation(
            launcher=slurm.LAUNCHER, master_addr=master_addr, nodes=("node1", "node2"), tasks_per_node=(1, 1), job_id="42", step_id="0",
            node_rank=node, submit_dir=str(tmp_path),
        )
        host = facts(interfaces=(LO, MGMT, iface("hsn0", f"198.18.0.{node + 1}/24")), resolved=TRAP)
        return make_plan(allocation, Options(nproc_per_node=1, rdzv_timeout=timeout, command=("x",)), host)

    return at(0), at(1)


def test_node0_writes_and_node1_reads_the_fabric_address(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The writer names itself as the scheduler does: its own gethostname() may differ.
    monkeypatch.setattr("hpctorch.plan.rendezvous.socket.gethostname", lambda: "nid-in-a-container")
    master, other = plans(tmp_path)
    assert master.master_exchange == other.master_exchange == str(tmp_path / ".hpctorch" / "slurm-42.0.master.json")
    assert (master.master_addr, other.master_addr) == ("198.18.0.1", None)
    assert "(read at start from" in table(other)
    reader = threading.Thread(target=lambda: results.append(read_master(other)))
    results: list = []
    reader.start()
    time.sleep(0.3)  # the reader is already waiting when the writer comes
    write_master(master)
    reader.join(10)
    assert results == ["198.18.0.1"]
    # discover then plans again with the address as the allocation's: a final plan.
    _, final = plans(tmp_path, master_addr=results[0])
    assert (final.master_addr, final.master_exchange) == ("198.18.0.1", None)
    assert final.workers[0].env["HPCTORCH_IFACE"] == "hsn0"


def test_a_stale_file_from_another_run_is_ignored_and_the_wait_times_out(tmp_path: Path) -> None:
    _, other = plans(tmp_path, timeout=1)
    path = Path(other.master_exchange or "")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"run_id": "slurm-41.0", "addr": "198.18.0.9"}))
    with pytest.raises(HpctorchError, match="waited 1 s for node1"):
        read_master(other)


def test_no_exchange_when_the_name_resolves_onto_the_fabric(tmp_path: Path) -> None:
    allocation = Allocation(launcher=slurm.LAUNCHER, nodes=("node1", "node2"), tasks_per_node=(1, 1), job_id="42", node_rank=1, submit_dir=str(tmp_path))
    plan = make_plan(allocation, Options(command=("x",)), facts(resolved={"node1": ("198.18.0.1",)}))
    assert plan.master_exchange is None and plan.master_addr == "198.18.0.1"


def test_a_file_from_a_previous_run_on_another_master_host_is_ignored(tmp_path: Path) -> None:
    _, other = plans(tmp_path, timeout=1)
    path = Path(other.master_exchange or "")
    path.parent.mkdir(parents=True)
    # Same run id (a requeued job), but written by node7, which no longer holds rank 0.
    path.write_text(json.dumps({"run_id": other.run_id, "addr": "198.18.0.7", "host": "node7"}))
    with pytest.raises(HpctorchError, match="waited 1 s for node1"):
        read_master(other)
    path.write_text(json.dumps({"run_id": other.run_id, "addr": "198.18.0.1", "host": "node1.cluster.example"}))
    assert read_master(other) == "198.18.0.1"


def test_a_master_flag_naming_node_0_is_replaced_by_the_exchanged_address(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hpctorch.plan import discover

    env = {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_JOB_NODELIST": "node[1-2]",
           "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1", "SLURM_NODEID": "1",
           "SLURM_LOCALID": "0", "SLURM_SUBMIT_DIR": str(tmp_path)}
    host = facts(interfaces=(LO, MGMT, iface("hsn0", "198.18.0.2/24")), resolved=TRAP, env=env)
    monkeypatch.setattr(discover, "gather", lambda *_a, **_k: host)
    master, _ = plans(tmp_path)
    write_master(master)  # node 0's record, for the same run id
    final = discover.plan_here(Options(master_addr="node1", nproc_per_node=1, rdzv_timeout=5, command=("x",)), env)
    assert final.master_addr == "198.18.0.1" and final.master_exchange is None


def task_plans(tmp_path: Path, timeout: int = 10):  # type: ignore[no-untyped-def]
    """Per task, 2 nodes x 2: (node 0's local rank 0, node 1's local ranks 0 and 1)."""
    def at(task: int):  # type: ignore[no-untyped-def]
        node = task // 2
        allocation = Allocation(
            launcher=slurm.LAUNCHER, nodes=("node1", "node2"), tasks_per_node=(2, 2), job_id="42", step_id="0",
            node_rank=node, task_rank=task, local_task_rank=task % 2, submit_dir=str(tmp_path / "shared"),
        )
        host = facts(interfaces=(LO, MGMT, iface("hsn0", f"198.18.0.{node + 1}/24")), resolved=TRAP)
        return make_plan(allocation, Options(mode="per-task", rdzv_timeout=timeout, command=("x",)), host)

    return at(0), at(2), at(3)


def counting_shared_reads(monkeypatch: pytest.MonkeyPatch, shared: Path) -> list[str]:
    """Which thread read the shared file, each time (the node-local relay is not counted)."""
    reads: list[str] = []
    original = Path.read_text

    def read_text(self: Path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if shared in self.parents:
            reads.append(threading.current_thread().name)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    return reads


def test_per_task_one_rank_a_node_reads_the_shared_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("hpctorch.plan.rendezvous.relay_dir", lambda: str(tmp_path / "node2-local"))
    master, first, second = task_plans(tmp_path)
    reads = counting_shared_reads(monkeypatch, tmp_path / "shared")
    results: dict[str, str] = {}
    readers = [threading.Thread(target=lambda p=plan, n=name: results.__setitem__(n, read_master(p)), name=name)
               for plan, name in ((first, "local rank 0"), (second, "local rank 1"))]
    for reader in readers:
        reader.start()
    time.sleep(0.5)  # both wait before node 0 writes
    write_master(master)
    for reader in readers:
        reader.join(10)
    assert results == {"local rank 0": "198.18.0.1", "local rank 1": "198.18.0.1"}
    assert reads and set(reads) == {"local rank 0"}, reads


def test_per_task_a_rank_without_its_local_rank_0_reads_the_shared_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A container with a /dev/shm of its own: local rank 0's relay never shows; after the grace the
    rank reads the shared file itself."""
    monkeypatch.setattr("hpctorch.plan.rendezvous.relay_dir", lambda: str(tmp_path / "private-tmp"))
    monkeypatch.setattr("hpctorch.plan.rendezvous.RELAY_GRACE_S", 0.3)
    master, _, second = task_plans(tmp_path)
    reads = counting_shared_reads(monkeypatch, tmp_path / "shared")
    write_master(master)
    assert read_master(second) == "198.18.0.1"
    assert reads  # after the grace, from the shared file


def test_per_task_a_relay_from_another_master_host_is_not_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A requeued run (same run id) on other nodes: the relay of the previous run names another node 0."""
    local = tmp_path / "node2-local"
    monkeypatch.setattr("hpctorch.plan.rendezvous.relay_dir", lambda: str(local))
    monkeypatch.setattr("hpctorch.plan.rendezvous.RELAY_GRACE_S", 0.3)
    master, _, second = task_plans(tmp_path)
    local.mkdir()
    (local / f"{second.run_id}.master.json").write_text(json.dumps({"run_id": second.run_id, "addr": "198.18.0.7", "host": "node7"}))
    write_master(master)
    assert read_master(second) == "198.18.0.1"


def test_relays_of_earlier_jobs_are_swept_after_a_day(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    local = tmp_path / "node2-local"
    monkeypatch.setattr("hpctorch.plan.rendezvous.relay_dir", lambda: str(local))
    local.mkdir()
    old, recent, other = local / "slurm-7.0.master.json", local / "slurm-8.0.master.json", local / "faulthandler"
    for path in (old, recent, other):
        path.write_text("{}")
    os.utime(old, (time.time() - 2 * 86400,) * 2)
    os.utime(other, (time.time() - 2 * 86400,) * 2)
    master, first, _ = task_plans(tmp_path)
    write_master(master)
    assert read_master(first) == "198.18.0.1"
    assert not old.exists() and recent.exists() and other.exists()
    assert (local / f"{first.run_id}.master.json").exists()


def test_files_a_node_polls_stay_in_memory_whatever_tmpdir_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Some sites point TMPDIR at a shared scratch file system: the relay (and the supervisor's
    agreement files) are polled every few milliseconds, so they live in /dev/shm where it is."""
    import tempfile

    from hpctorch.host import folders
    from hpctorch.plan.rendezvous import relay_dir

    monkeypatch.setenv("TMPDIR", str(tmp_path / "scratch"))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    (tmp_path / "scratch").mkdir()
    if Path("/dev/shm").is_dir():
        assert relay_dir().startswith("/dev/shm/hpctorch-")
    monkeypatch.setattr(folders, "polling_root", lambda: None)  # macOS, or no /dev/shm to write
    assert relay_dir().startswith(str(tmp_path / "scratch"))


def test_on_a_routed_fabric_node_0_writes_the_address_that_a_node_of_another_subnet_reads(tmp_path: Path) -> None:
    """A subnet per rack: node1's name resolves to its fabric address, on node 0's subnet but not
    on node 1's. Reproduced before: node 0 saw no need and wrote nothing; node 1 waited 300 s."""
    def at(node: int):  # type: ignore[no-untyped-def]
        allocation = Allocation(launcher=slurm.LAUNCHER, nodes=("node1", "node2"), tasks_per_node=(1, 1), job_id="42", step_id="0",
                                node_rank=node, submit_dir=str(tmp_path))
        rack = facts(interfaces=(LO, MGMT, iface("hsn0", f"198.18.{node}.1/24")), resolved={"node1": ("198.18.0.1",)})
        return make_plan(allocation, Options(nproc_per_node=1, rdzv_timeout=5, command=("x",)), rack)

    master, other = at(0), at(1)
    assert master.master_addr == "198.18.0.1" and master.master_exchange_offered
    assert "for nodes whose subnet its name does not resolve onto" in master.reasons["master_addr"]
    assert other.master_addr is None and other.master_exchange == master.master_exchange
    write_master(master)
    assert read_master(other) == "198.18.0.1"


def test_no_file_is_offered_where_node_0_is_listed_by_address_or_nothing_is_shared(tmp_path: Path) -> None:
    allocation = Allocation(launcher=slurm.LAUNCHER, nodes=("198.18.0.1", "198.18.0.2"), tasks_per_node=(1, 1), job_id="42",
                            node_rank=0, submit_dir=str(tmp_path))
    host = facts(interfaces=(LO, MGMT, iface("hsn0", "198.18.0.1/24")))
    assert make_plan(allocation, Options(command=("x",)), host).master_exchange is None
    named = Allocation(launcher=slurm.LAUNCHER, nodes=("node1", "node2"), tasks_per_node=(1, 1), job_id="42", node_rank=0)
    assert make_plan(named, Options(command=("x",)), host).master_exchange is None


def test_stack_dumps_and_the_file_store_live_on_the_node_whatever_tmpdir_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A TMPDIR on shared scratch held every node's stack dumps side by side."""
    import tempfile

    from hpctorch.host import folders
    from hpctorch.stacks.job import write_dump

    monkeypatch.setenv("TMPDIR", str(tmp_path / "scratch"))
    monkeypatch.setattr(tempfile, "tempdir", None)
    (tmp_path / "scratch").mkdir()
    monkeypatch.setattr(folders, "polling_root", lambda: str(tmp_path / "shm"))
    (tmp_path / "shm").mkdir()
    dump = write_dump([], "test")
    assert dump and dump.startswith(str(tmp_path / "shm" / "hpctorch-"))
    assert list((tmp_path / "scratch").iterdir()) == []


def test_a_sweep_removes_only_old_entries_of_the_names_given(tmp_path: Path) -> None:
    import os

    from hpctorch.host.folders import sweep

    old_file, old_dir, new_file, other = tmp_path / "a.master.json", tmp_path / "b.agreement", tmp_path / "c.master.json", tmp_path / "d.txt"
    old_dir.mkdir()
    (old_dir / "node1.json").write_text("{}")
    for path in (old_file, new_file, other):
        path.write_text("{}")
    for path in (old_file, old_dir, other):
        os.utime(path, (time.time() - 3 * 86400,) * 2)
    sweep(str(tmp_path), (".master.json", ".agreement"), 86400)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.master.json", "d.txt"]

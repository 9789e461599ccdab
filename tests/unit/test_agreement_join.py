"""Another node joins node 0's store only once it answers as this job's node 0, and what else
listens at the master port before node 0 binds it costs a probe, not the job: a listener that
takes the connection and never answers (torch's own client waits on it for ever, whatever its
timeout), another job's store. Real sockets, real torch TCPStores, node 1 in its own process."""

from __future__ import annotations

import datetime
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpctorch.guard import agreement, authority
from hpctorch.host.network import free_port
from hpctorch.plan.types import Plan

pytest.importorskip("torch")


def _plan(node: int, port: int) -> Plan:
    return Plan(mode="per-node", scheduler="local", job_id=None, nodes=(), node_rank=node, nproc_per_node=(1, 1),
                master_addr="127.0.0.1", master_port=port, rdzv_backend="static", rdzv_timeout=120, run_id=f"local-{port}",
                iface="lo", simulated=False, max_restarts=0, workers=(), common_env={}, master_ports=(), watch_port=1,
                reasons={})


@pytest.fixture(autouse=True)
def own_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(authority, "_made", {})
    yield


def _node_1(tmp_path: Path, port: int) -> subprocess.Popen:
    """Node 1's agreement check in its own process (a hang there is killed, not waited on)."""
    (tmp_path / "plan1.json").write_text(_plan(1, port).to_json())
    code = ("import json\n"
            "from hpctorch.guard import agreement\n"
            "from hpctorch.plan.types import Plan\n"
            f"plan = Plan.from_dict(json.load(open({str(tmp_path / 'plan1.json')!r})))\n"
            "assert agreement.check(plan, 120) is None\n"
            "print('agreed', flush=True)\n")
    return subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _node_0(port: int, done: list) -> threading.Thread:
    def serve() -> None:
        done.append(agreement.check(_plan(0, port), 120))  # node 0's store, held until the test ends

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def _agreed(node1: subprocess.Popen, node0: threading.Thread, done: list) -> None:
    try:
        out, err = node1.communicate(timeout=120)  # a hang guard: the probe is 3 s
    except subprocess.TimeoutExpired:
        node1.kill()
        out, err = node1.communicate()
    node0.join(timeout=120)
    assert node1.returncode == 0 and out.strip() == "agreed", err[-3000:]
    assert done and done[0] is not None  # node 0 heard node 1


def test_a_listener_that_takes_the_connection_and_never_answers_costs_a_probe(tmp_path: Path) -> None:
    """Before node 0 binds the port, something else takes node 1's store connection and holds it
    without a word, then lets go of the port (not of the connection); node 0 then serves there.
    Reproduced before: node 1's torch client waited on that connection for ever."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    node1 = _node_1(tmp_path, port)
    held: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 120  # a hang guard: node 1 connects within seconds
        while True:  # node 1's plain connects close at once; its store client speaks first
            assert time.monotonic() < deadline, "node 1 never opened a store connection"
            conn, _ = listener.accept()
            if select.select([conn], [], [], 5)[0] and conn.recv(1, socket.MSG_PEEK):
                held.append(conn)
                break
            conn.close()
        listener.close()  # the port is free to bind again; the connection stays, unanswered
        done: list = []
        _agreed(node1, _node_0(port, done), done)
    finally:
        node1.kill()
        for conn in held:
            conn.close()


def test_another_jobs_store_at_the_master_port_is_waited_past_and_named_meanwhile(tmp_path: Path) -> None:
    """Another job's store holds the port (a store, but no record of this job's node 0): node 1
    says so while it waits, and joins this job's node 0 once that serves there. Before, node 1
    gave up at once ('not this job's node 0') and node 0 waited for it until its timeout."""
    from torch.distributed import TCPStore

    port = free_port()
    other = TCPStore("127.0.0.1", port, None, True, datetime.timedelta(seconds=30), wait_for_workers=False)
    node1 = _node_1(tmp_path, port)
    try:
        assert node1.stderr is not None
        deadline = time.monotonic() + 120  # a hang guard: the progress line comes at 10 s
        while True:
            assert time.monotonic() < deadline, "node 1 never said what it met"
            line = node1.stderr.readline()
            assert line, f"node 1 ended: {node1.communicate()}"
            if "waiting to reach node 0's store" in line:
                assert "gave no hpctorch authority record" in line, line
                break
        del other  # the other job ends; this job's node 0 serves on the port
        done: list = []
        _agreed(node1, _node_0(port, done), done)
    finally:
        node1.kill()


def test_without_node_0_the_timeout_names_what_answered_there(tmp_path: Path) -> None:
    from torch.distributed import TCPStore

    port = free_port()
    other = TCPStore("127.0.0.1", port, None, True, datetime.timedelta(seconds=30), wait_for_workers=False)
    started = time.monotonic()
    with pytest.raises(agreement.HpctorchError) as raised:
        agreement.check(_plan(1, port), 5)
    assert time.monotonic() - started < 60  # a hang guard only
    assert raised.value.cause.startswith(f"could not reach the master's store at 127.0.0.1:{port} from lo within 5 s "
                                         "(the last answer there: the store at"), raised.value.cause
    assert "it is not this job's node 0" in raised.value.cause
    del other
    json.dumps(raised.value.cause)  # one line

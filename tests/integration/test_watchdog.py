"""The watchdog's protocol on one real TCPStore, with simulated nodes as threads (the
benchmark runs the same code at 4,096 nodes; here it must be correct, not fast)."""

from __future__ import annotations

import datetime
import json
import time

import pytest

from hpctorch.guard import authority, judge, watchdog
from hpctorch.host.network import free_port
from hpctorch.plan.types import Plan

torch = pytest.importorskip("torch")


def plan(node: int, nnodes: int, port: int) -> Plan:
    return Plan(mode="per-node", scheduler="test", job_id="1", nodes=tuple(f"n{i}" for i in range(nnodes)), node_rank=node,
                nproc_per_node=(1,) * nnodes, master_addr="127.0.0.1", master_port=port, rdzv_backend="static", rdzv_timeout=30,
                run_id="wd", iface="lo", simulated=False, max_restarts=0, workers=(), common_env={})


def serve(port: int):  # type: ignore[no-untyped-def]
    """Node 0's store, with the record by which every watchdog authenticates it (``authority``)."""
    server = torch.distributed.TCPStore("127.0.0.1", port, is_master=True, timeout=datetime.timedelta(seconds=30),
                                        wait_for_workers=False, multi_tenant=True)
    authority.publish(server, plan(0, 1, port))
    return server


def start(nnodes: int) -> tuple[object, list[watchdog.JobWatchdog], dict[int, str]]:
    port = free_port()
    server = serve(port)
    acted: dict[int, str] = {}
    dogs = [watchdog.JobWatchdog(plan(n, nnodes, port), 30, on_abort=lambda reason, n=n: acted.setdefault(n, reason)).start()
            for n in range(nnodes)]
    return server, dogs, acted


def wait_for(condition, limit: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, "hung: the watchdogs never got there"
        time.sleep(0.05)


@pytest.mark.parametrize("failing", [2, 0])
def test_a_failure_reaches_every_node_even_from_node_0(failing: int) -> None:
    server, dogs, acted = start(4)
    wait_for(lambda: server.check([f"hpctorch/wd/beat/{n}" for n in range(4)]))  # every node beats
    assert acted == {}
    dogs[failing].report_failure(f"rank {failing} exited with code 1")
    wait_for(lambda: len(acted) == 3)
    assert set(acted) == {0, 1, 2, 3} - {failing}
    assert set(acted.values()) == {f"rank {failing} exited with code 1"}
    for dog in dogs:
        dog.close()
    # Node 0 served until every node had read the abort.
    assert server.add("hpctorch/wd/ack", 0) == 4


def test_node_0_alone_names_a_node_that_went_silent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(judge, "SILENT_AFTER_S", 3.0)  # above the 2 s between beats: no false alarm
    server, dogs, acted = start(3)
    wait_for(lambda: server.check([f"hpctorch/wd/beat/{n}" for n in range(3)]))  # node 0 judges once all beat
    dogs[1]._stop.set()  # node 1 freezes: its counter stops moving, it says nothing
    wait_for(lambda: len(acted) == 2)
    assert acted[0] == acted[2] == "node 1 (n1) went silent: no heartbeat for 3 s"
    for dog in dogs:
        dog.close()


def test_a_node_that_left_for_a_hot_spare_is_not_silent_and_the_summary_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(judge, "SILENT_AFTER_S", 3.0)
    server, dogs, acted = start(3)
    wait_for(lambda: server.check([f"hpctorch/wd/beat/{n}" for n in range(3)]))
    dogs[1].replaced()  # its rank died first; a spare took its seat (start.spares)
    before = server.add("hpctorch/wd/beat/0", 0)
    wait_for(lambda: server.add("hpctorch/wd/beat/0", 0) >= before + 3)  # node 0 polled on past the silence window (6 s)
    assert acted == {}
    dogs[2].finished()
    dogs[0].finished()  # node 0 lingers until every node is done or replaced, then reads the final state
    assert dogs[0].final["done"] == {0: True, 1: False, 2: True} and dogs[0].final["replaced"] == {1: True}


def _start_with_spares(nnodes: int) -> tuple[object, list[watchdog.JobWatchdog], dict[int, str]]:
    port = free_port()
    server = serve(port)
    acted: dict[int, str] = {}
    dogs = [watchdog.JobWatchdog(plan(n, nnodes, port), 30, on_abort=lambda reason, n=n: acted.setdefault(n, reason), spares=1).start()
            for n in range(nnodes)]
    return server, dogs, acted


@pytest.mark.parametrize("moves_in", [True, False], ids=["spare-moves-in", "no-spare-comes"])
def test_with_a_hot_spare_a_silent_node_is_left_to_it(monkeypatch: pytest.MonkeyPatch, capsys, moves_in: bool) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(judge, "SILENT_AFTER_S", 3.0)
    monkeypatch.setattr(judge, "MOVE_IN_S", 4.0)
    server, dogs, acted = _start_with_spares(3)
    wait_for(lambda: server.check([f"hpctorch/wd/beat/{n}" for n in range(3)]))
    dogs[1]._stop.set()  # node 1 is lost whole: torch's rendezvous drops it, a spare moves in (start.spares)
    wait_for(lambda: server.get("hpctorch/wd/beat/1") == watchdog.REPLACED)
    assert "hpctorch: node 1 (n1) went silent: no heartbeat for 3 s; a hot spare takes its place" in capsys.readouterr().err
    if moves_in:
        server.add("hpctorch/wd/spares/in", 1)
        before = server.add("hpctorch/wd/beat/0", 0)
        wait_for(lambda: server.add("hpctorch/wd/beat/0", 0) >= before + 3)  # node 0 polled on past the wait for a spare (6 s)
        assert acted == {}
    else:  # no spare took the seat: the job ends, as it would have without spares
        wait_for(lambda: len(acted) == 2)
        assert acted[0] == acted[2] == "node 1 (n1) went silent, and no hot spare moved in within 4 s"
    assert server.add("hpctorch/wd/spares/used", 0) == 1
    for dog in dogs:
        dog.close()


def test_a_spare_that_moved_in_is_watched_like_the_seat_it_took(monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """The spare beats on a slot of its own (its plan has the kept nodes, then the spares): once
    it moved in, node 0 watches that slot, and the spare lost whole later is named, not missed."""
    monkeypatch.setattr(judge, "SILENT_AFTER_S", 3.0)
    monkeypatch.setattr(judge, "MOVE_IN_S", 4.0)
    server, dogs, acted = _start_with_spares(3)
    spare = watchdog.JobWatchdog(plan(3, 4, server.port), 30, on_abort=lambda reason: acted.setdefault(3, reason), spares=1).start()
    wait_for(lambda: server.check([f"hpctorch/wd/beat/{n}" for n in range(4)]))
    dogs[1]._stop.set()  # node 1 is lost whole
    wait_for(lambda: server.get("hpctorch/wd/beat/1") == watchdog.REPLACED)
    index = server.add("hpctorch/wd/spares/in", 1)  # the spare moves in, as start.spares says it: sealed
    sealed = authority.SealedStore(server, authority.node0_seal("wd"))
    sealed.set(f"hpctorch/wd/spares/in/{index}", "n3")
    sealed.set(f"hpctorch/wd/spares/in/{index}/node", "3")
    before = server.add("hpctorch/wd/beat/0", 0)
    wait_for(lambda: server.add("hpctorch/wd/beat/0", 0) >= before + 2)  # node 0 judged past the move
    assert acted == {}
    spare._stop.set()  # and is lost whole later
    wait_for(lambda: len(acted) == 2)
    assert acted[0] == acted[2] == "n3 (a hot spare that moved in) went silent: no heartbeat for 3 s", acted
    for dog in (*dogs, spare):
        dog.close()


def test_a_spare_whose_watchdog_never_beat_is_not_waited_for() -> None:
    """A spare that moved in but whose watchdog never beat (it could not reach or authenticate the
    store): node 0 must not ask for its counter before it exists (a multi_get waits for every
    key), or its own polls would stall and it would end the job as if its store were gone."""
    server, dogs, acted = _start_with_spares(3)
    wait_for(lambda: server.check([f"hpctorch/wd/beat/{n}" for n in range(3)]))
    index = server.add("hpctorch/wd/spares/in", 1)
    sealed = authority.SealedStore(server, authority.node0_seal("wd"))
    sealed.set(f"hpctorch/wd/spares/in/{index}", "n7")
    sealed.set(f"hpctorch/wd/spares/in/{index}/node", "7")  # beat/7: never written
    before = server.add("hpctorch/wd/beat/0", 0)
    wait_for(lambda: server.add("hpctorch/wd/beat/0", 0) >= before + 3)  # node 0 polled on for 6 s
    assert acted == {}
    for dog in dogs:
        dog.close()


def test_requests_per_node_do_not_grow_with_the_node_count() -> None:
    rates = {}
    for nnodes in (2, 12):
        server, dogs, acted = start(nnodes)
        time.sleep(1.0)
        before = [d.requests for d in dogs]
        time.sleep(3.0)
        rates[nnodes] = max(d.requests - b for d, b in zip(dogs, before))
        for dog in dogs:
            dog.finished()
        assert acted == {}
    # Each node: at most three requests per interval, whatever N (node 0: two and one multi_get).
    assert rates[12] <= rates[2] + 3, rates
    assert rates[12] <= 3 * (3.0 / watchdog.POLL_S + 1), rates


def test_a_node_that_never_beat_is_named_once_all_were_up(monkeypatch: pytest.MonkeyPatch) -> None:
    # Where the workers start before the watchdog (hpctorch's own starter), node 0 names a node
    # whose watchdog never arrived NEVER_BEAT_S after every node's workers were known to run.
    monkeypatch.setattr(judge, "NEVER_BEAT_S", 1.0)
    port = free_port()
    server = serve(port)
    acted: dict[int, str] = {}
    up = time.monotonic()
    dogs = [watchdog.JobWatchdog(plan(n, 3, port), 30, on_abort=lambda reason, n=n: acted.setdefault(n, reason),
                                 all_up=lambda: up).start() for n in (0, 1)]  # node 2 never comes
    wait_for(lambda: len(acted) == 2)
    assert acted[0] == acted[1] == "node 2 (n2) never reached the watchdog's store: no heartbeat 1 s after every node's workers started"
    for dog in dogs:
        dog.close()
    assert server.check(["hpctorch/wd/abort"])


def test_without_all_up_a_late_node_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(judge, "NEVER_BEAT_S", 0.5)
    server, dogs, acted = start(2)
    dogs[1].close()  # never beats again; node 0 does not know when all were up: no verdict on a start
    before = server.add("hpctorch/wd/beat/0", 0)
    wait_for(lambda: server.add("hpctorch/wd/beat/0", 0) >= before + 2)  # node 0 polled on, 4 s past NEVER_BEAT_S
    assert acted == {}
    for dog in dogs:
        dog.close()
    del server


def test_a_reason_read_from_the_store_reaches_the_terminal_with_its_control_characters_escaped() -> None:
    """Any process that reaches the store can write the abort reason: it must not be able to
    retitle the window, move the cursor or hide a line on every node's terminal."""
    server, dogs, acted = start(2)
    wait_for(lambda: all(dog.connected.is_set() for dog in dogs))
    dogs[0].report_failure("rank 0 exited\x1b]0;pwned\x07\r\x1b[2Kall is well\nnext")
    wait_for(lambda: 1 in acted)
    assert acted[1] == "rank 0 exited\\x1b]0;pwned\\x07\\x0d\\x1b[2Kall is well\\x0anext"
    for dog in dogs:
        dog.close()


def test_a_stalled_file_system_on_one_node_does_not_make_it_silent(monkeypatch: pytest.MonkeyPatch) -> None:
    """Node 1's log folder hangs (a shared file system stalled for 30 s): sizing it blocks, but
    its beats go on and node 0 names nobody. Before, the sizing ran in the beating thread."""
    import threading

    monkeypatch.setattr(judge, "SILENT_AFTER_S", 3.0)  # above the 2 s between beats
    port = free_port()
    server = serve(port)
    stalled, sized = threading.Event(), threading.Event()

    def hanging_size() -> int:
        sized.set()
        stalled.wait(60)
        return 0

    acted: dict[int, str] = {}
    stalls = [watchdog.StallWatch(600, False, lambda: 0), watchdog.StallWatch(600, False, hanging_size)]
    dogs = [watchdog.JobWatchdog(plan(n, 2, port), 30, on_abort=lambda reason, n=n: acted.setdefault(n, reason), stall=stalls[n]).start()
            for n in range(2)]
    try:
        wait_for(sized.is_set)
        before = server.add("hpctorch/wd/beat/1", 0)
        # Node 1 beats on, past SILENT_AFTER_S (or node 0 called it silent: the failure).
        wait_for(lambda: acted or server.add("hpctorch/wd/beat/1", 0) >= before + 3)
        assert acted == {}
    finally:
        stalled.set()
        for dog in dogs:
            dog.close()


def test_the_closing_state_names_the_node_never_heard_from_and_reads_the_others() -> None:
    """Node 2 never beat (its helper never reached the store): node 0's final reading still has
    nodes 0 and 1, one by one, instead of nothing for all."""
    port = free_port()
    server = serve(port)
    node0 = watchdog.JobWatchdog(plan(0, 3, port), 30)
    server.set(watchdog.beat_key("wd", 0), watchdog.DONE)
    server.add(watchdog.beat_key("wd", 1), 3)
    final = node0._read_final(server)
    assert final["done"] == {0: True, 1: False}, final
    server.set(watchdog.beat_key("wd", 1), watchdog.DONE)
    server.set(watchdog.beat_key("wd", 2), watchdog.DONE)
    assert node0._read_final(server)["done"] == {0: True, 1: True, 2: True}


def test_node_0_names_the_first_failure_in_time_from_the_records_this_job_wrote() -> None:
    """Node 0's rank, broken by a peer that raised, fails first as node 0 sees it: its closing
    line still names the peer's failure, which node 1 recorded as earlier; a stranger's record,
    earlier still, is never named."""
    from hpctorch.start.workers import WorkersFailed, first_reported

    server, dogs, acted = start(3)
    wait_for(lambda: all(dog.connected.is_set() for dog in dogs))
    stranger = torch.distributed.TCPStore("127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=30))
    forged = stranger.add("hpctorch/wd/failures", 1)
    stranger.set(f"hpctorch/wd/failure/{forged}", json.dumps({"node": 2, "line": "rank 5 raised Forged", "at": 1.0}))
    dogs[1].report_failure("rank 1 on node 1 (local rank 0) raised KeyError: 'x' at train.py:4", at=1000.0)
    wait_for(lambda: 0 in acted and 2 in acted)
    own = WorkersFailed("rank 0 on node 0 (local rank 0) raised RuntimeError: Connection closed by peer", at=1000.5)
    dogs[0].report_failure(own.line, own.at)
    dogs[2].close()
    failures = dogs[0].final["failures"]
    assert sorted(r["node"] for r in failures.values()) == [0, 1], failures  # type: ignore[union-attr]
    named = first_reported(own, failures)
    assert named is not None and named.line == "rank 1 on node 1 (local rank 0) raised KeyError: 'x' at train.py:4"
    assert named.exit_code == own.exit_code and named.at == 1000.0
    assert first_reported(WorkersFailed("rank 0 raised first", at=999.0), failures).line == "rank 0 raised first"  # type: ignore[union-attr]
    stopped = WorkersFailed("stopped: node 1 went silent: no heartbeat for 10 s")
    assert first_reported(stopped, failures) is stopped  # a stop is said as it is


def test_an_abort_this_job_did_not_write_stops_nobody(capsys) -> None:  # type: ignore[no-untyped-def]
    """Anyone who reaches node 0's port can write the store: an abort without the run's seal
    (or the state counter alone) is said once and ignored; the job's own abort still acts."""
    server, dogs, acted = start(3)
    wait_for(lambda: all(dog.connected.is_set() for dog in dogs))
    stranger = torch.distributed.TCPStore("127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=30))
    stranger.add("hpctorch/wd/state", watchdog.ABORTED)  # aborted, with no reason at all
    wait_for(lambda: "with no reason recorded" in capsys.readouterr().err)
    stranger.set("hpctorch/wd/abort", "stop: node 1 failed")
    wait_for(lambda: "carries no hpctorch seal" in capsys.readouterr().err)
    before = server.add("hpctorch/wd/beat/1", 0)
    wait_for(lambda: server.add("hpctorch/wd/beat/1", 0) >= before + 2)  # polls went on, twice
    assert acted == {}
    dogs[2].report_failure("rank 2 exited with code 1")
    wait_for(lambda: len(acted) == 2)
    assert set(acted.values()) == {"rank 2 exited with code 1"}
    for dog in dogs:
        dog.close()


def test_a_store_that_does_not_authenticate_is_never_acted_on(capsys) -> None:  # type: ignore[no-untyped-def]
    """Someone else serves the job's watch port (no record of this run there): the watchdog says
    so in one line and watches nothing; an abort written there stops nobody."""
    port = free_port()
    squatter = torch.distributed.TCPStore("127.0.0.1", port, is_master=True, timeout=datetime.timedelta(seconds=30),
                                          wait_for_workers=False, multi_tenant=True)
    squatter.set("hpctorch/wd/abort", "stop")
    squatter.add("hpctorch/wd/state", watchdog.ABORTED)
    acted: dict[int, str] = {}
    dog = watchdog.JobWatchdog(plan(1, 2, port), 2, on_abort=lambda reason: acted.setdefault(1, reason)).start()
    wait_for(lambda: not dog._thread.is_alive())
    said = capsys.readouterr().err
    assert "hpctorch: node 1's workers run unwatched: the store at 127.0.0.1:" in said and "authority record" in said, said
    assert acted == {} and not dog.connected.is_set()
    dog.close()


def test_node_0_shows_only_the_stacks_this_job_s_nodes_sent() -> None:
    """The stacks travel through the watchdog's store under the run's seal: a part someone else
    planted (and a garbled name on the list) is left out; the job's own are shown."""
    from hpctorch.stacks import job

    port = free_port()
    server = serve(port)
    seal = authority.verify(server, plan(0, 1, port), 10)
    sealed = authority.SealedStore(server, seal)
    job.publish(sealed, "hpctorch/wd/stacks/teardown/", [1], [{"ranks": [1], "frames": ["train.py:10"]}])
    server.set("hpctorch/wd/stacks/teardown/part/2", json.dumps({"t": time.time(), "nodes": [2], "groups": [{"forged": True}]}))
    server.append("hpctorch/wd/stacks/teardown/who", "2,x,")
    parts, covered = job.collect(sealed, "hpctorch/wd/stacks/teardown/", {0}, 3, 3.0)
    assert parts == [[{"ranks": [1], "frames": ["train.py:10"]}]] and covered == {0, 1}


def test_a_dump_is_taken_only_for_node_0s_sealed_request_never_for_a_strangers_add() -> None:
    """The stall dump's wake-up is a counter anyone at the port can add to; what a node answers is
    node 0's sealed stall number (``stacks/asked``), each once."""
    server, dogs, acted = start(2)
    wait_for(lambda: server.check(["hpctorch/wd/beat/0", "hpctorch/wd/beat/1"]))  # both authenticated the store
    node1 = dogs[1]
    server.add("hpctorch/wd/stacks/want", 1)  # a stranger's request: no number sealed
    assert node1._asked(server) is None
    server.set("hpctorch/wd/stacks/asked", "1")  # planted without the run's seal
    assert node1._asked(server) is None
    authority.SealedStore(server, authority.node0_seal("wd")).set("hpctorch/wd/stacks/asked", "1")  # node 0's (judge.stalled)
    assert node1._asked(server) == 1
    node1._answered = 1
    assert node1._asked(server) is None  # answered once
    for dog in dogs:
        dog.close()
    assert acted == {}

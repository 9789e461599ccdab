"""Hot spares' policy (``start.spares``) on a real TCPStore and torch's real c10d rendezvous
handlers, two "nodes" as handlers of one process: the first failed node claims the round's fault,
a death by a signal outranks an exit, the master restarts in place, the spare count holds, and a
spare waits in torch's redundancy list until a node leaves, then moves in. The records that steer
a node are sealed: a stranger's planted claim, ``ready`` or slot is never acted on."""

from __future__ import annotations

import datetime
import threading
import time

import pytest

from hpctorch.guard import authority
from hpctorch.guard.judge import Judge
from hpctorch.guard.keys import spares_prefix
from hpctorch.host.network import free_port
from hpctorch.plan.types import Plan
from hpctorch.start import spares

torch = pytest.importorskip("torch")


def _plan(node: int, nnodes: int, port: int) -> Plan:
    return Plan(mode="per-node", scheduler="test", job_id="7", nodes=tuple(f"nid{n}" for n in range(nnodes)), node_rank=node,
                nproc_per_node=(1,) * nnodes, master_addr="127.0.0.1", master_port=port, rdzv_backend="c10d", rdzv_timeout=30,
                run_id="spares-test", iface="lo", simulated=False, max_restarts=1, workers=(), common_env={}, local_addr="127.0.0.1")


def _store(port: int, master: bool):  # type: ignore[no-untyped-def]
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", port, None, master, datetime.timedelta(seconds=30), wait_for_workers=False, multi_tenant=True)


def _failure(local_rank: int, exitcode: int):  # type: ignore[no-untyped-def]
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    return ProcessFailure(local_rank=local_rank, pid=1000 + local_rank, exitcode=exitcode, error_file="")


def _seal():  # type: ignore[no-untyped-def]
    """The run's seal as node 0 makes it (once per process: every "node" here is in this one, so
    the handlers' creator takes it as node 0's own, ``authority.run_seal``)."""
    return authority.node0_seal("spares-test")


def _seats(port: int, nnodes: int = 3, spares_count: int = 1) -> list[spares.Seat]:
    seats = []
    for node in range(nnodes):
        seat = spares.Seat(_plan(node, nnodes, port), spares_count, nnodes, spare=False, host=f"nid{node}")
        seat.store, seat.round, seat.seal = _store(port, False), 0, _seal()
        seats.append(seat)
    return seats


def test_the_first_node_to_fail_leaves_and_its_peers_restart(capsys) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    server = _store(port, True)  # noqa: F841 - serves the seats' store
    _, killed, broken = _seats(port)
    killed.failed(object(), {0: _failure(0, -9)})
    broken.failed(object(), {0: _failure(0, 1)})
    assert killed.leaving == ("its local rank 0 died of SIGKILL", -9)
    assert broken.leaving is None
    assert capsys.readouterr().err == ""  # a peer that restarts says nothing


def test_a_death_by_a_signal_outranks_an_exit_that_came_first() -> None:
    port = free_port()
    server = _store(port, True)  # noqa: F841
    _, killed, broken = _seats(port)
    # The broken peer's Python error path noticed first; the killed rank's agent a moment later.
    early = threading.Thread(target=broken.failed, args=(object(), {1: _failure(1, 1)}))
    early.start()
    time.sleep(0.1)
    killed.failed(object(), {0: _failure(0, -7)})
    early.join(timeout=30)
    assert killed.leaving is not None and killed.leaving[1] == -7 and "SIGBUS" in killed.leaving[0]
    assert broken.leaving is None


def test_an_abort_counts_as_an_error_path_not_as_a_kill() -> None:
    port = free_port()
    server = _store(port, True)  # noqa: F841
    _, killed, aborted = _seats(port)
    # NCCL's watchdog aborts the ranks whose collectives broke: SIGABRT, maybe before the killed rank's agent noticed.
    early = threading.Thread(target=aborted.failed, args=(object(), {0: _failure(0, -6)}))
    early.start()
    time.sleep(0.1)
    killed.failed(object(), {0: _failure(0, -9)})
    early.join(timeout=30)
    assert killed.leaving is not None and aborted.leaving is None


def test_the_master_restarts_in_place_and_the_spares_run_out(capsys) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    server = _store(port, True)  # noqa: F841
    master, first, second = _seats(port)
    master.failed(object(), {0: _failure(0, -9)})
    assert master.leaving is None
    assert "nid0 cannot be replaced by a spare (it serves the job's store): it restarts in place" in capsys.readouterr().err
    first.round = second.round = 1
    first.failed(object(), {0: _failure(0, -9)})
    assert first.leaving is not None
    second.round = 2
    second.failed(object(), {0: _failure(0, -11)})
    assert second.leaving is None  # one spare, already used
    assert "no spare left to replace nid2: it restarts in place (its local rank 0 died of SIGSEGV)" in capsys.readouterr().err


def test_one_claim_per_round_and_none_before_the_seat_is_taken() -> None:
    port = free_port()
    server = _store(port, True)  # noqa: F841
    _, node, _ = _seats(port)
    node.failed(object(), {})  # no failures: a success or a membership restart
    assert node.leaving is None
    node.failed(object(), {0: _failure(0, -9)})
    node.leaving = None
    node.failed(object(), {0: _failure(0, -9)})  # torch closes a round's context twice (its poll, then the agent)
    assert node.leaving is None
    waiting = spares.Seat(_plan(2, 3, port), 1, 2, spare=True, host="nid2")
    waiting.store, waiting.seal = node.store, node.seal
    waiting.failed(object(), {0: _failure(0, -9)})
    assert waiting.leaving is None


def _handler(seat: spares.Seat, port: int, seats: int):  # type: ignore[no-untyped-def]
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    _seal()
    spares.seat_for(seat)
    # torch's own keep-alive (every 5 s, dead after 3 missed): with 1 s, a loaded machine starved a
    # seated node's keep-alive thread for 3 s, and the spare took its seat as a dead node's.
    params = RendezvousParameters(backend=spares.BACKEND, endpoint=f"127.0.0.1:{port}", run_id="spares-test", min_nodes=seats,
                                  max_nodes=seats, join_timeout=30, is_host="false", keep_alive_interval=5)
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    return rendezvous_handler_registry.create_handler(params)


def _until_waiting(seated, spare) -> None:  # type: ignore[no-untyped-def]
    """Until the spare's handler waits in torch's redundancy list (torch's rendezvous state, read
    through the seated node's handler): an event, not a window that must be long enough."""
    deadline = time.monotonic() + 60
    while True:
        seated._state_holder.sync()
        if spare._this_node in seated._state_holder.state.redundancy_list:
            return
        assert time.monotonic() < deadline, "the spare never waited in torch's redundancy list"
        time.sleep(0.1)


def test_a_spare_waits_in_torch_s_rendezvous_and_moves_in_when_the_failed_node_leaves(capsys) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    server = _store(port, True)  # noqa: F841
    kept = spares.Seat(_plan(1, 2, port), 1, 1, spare=False, host="nid1")
    kept_handler = _handler(kept, port, 1)
    assert kept_handler.get_backend() == spares.BACKEND
    kept_handler.next_rendezvous()  # one seat: the first round completes with this node alone
    assert kept.round == 0 and kept.store.check([kept.prefix + "ready"])
    spare = spares.Seat(_plan(1, 2, port), 1, 1, spare=True, host="nid2")
    spare_handler = _handler(spare, port, 1)
    moved: list[object] = []
    waiting = threading.Thread(target=lambda: moved.append(spare_handler.next_rendezvous()), daemon=True)
    waiting.start()
    _until_waiting(kept_handler, spare_handler)
    assert not moved and not spare.joined  # in torch's redundancy list while the seat is taken
    kept.failed(object(), {0: _failure(0, -9)})
    with pytest.raises(spares.Replaced) as left:
        kept_handler.next_rendezvous()
    assert left.value.exit_code == -9
    assert kept_handler.shutdown() is True and not kept_handler.is_closed()  # leaving closes nothing
    waiting.join(timeout=60)
    assert moved and spare.joined and spare.round == 1, moved
    assert "nid2 moves in from the spares: the job goes on in round 1" in capsys.readouterr().err
    assert spare.sealed.get(spare.prefix + "in/1") == b"nid2"
    spare_handler.shutdown()  # a seated node ends with the job: it closes the rendezvous


def test_a_spare_never_needed_leaves_when_the_job_closes_the_rendezvous() -> None:
    port = free_port()
    server = _store(port, True)  # noqa: F841
    kept = spares.Seat(_plan(0, 2, port), 1, 1, spare=False, host="nid0")
    kept_handler = _handler(kept, port, 1)
    kept_handler.next_rendezvous()
    spare = spares.Seat(_plan(1, 2, port), 1, 1, spare=True, host="nid1")
    spare_handler = _handler(spare, port, 1)
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            spare_handler.next_rendezvous()
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            outcome.append(exc)

    waiting = threading.Thread(target=wait, daemon=True)
    waiting.start()
    _until_waiting(kept_handler, spare_handler)
    kept_handler.shutdown()  # the job finished: torch's launch_agent closes the rendezvous
    waiting.join(timeout=60)
    assert outcome and isinstance(outcome[0], spares.SpareDone), outcome
    assert spare_handler.shutdown() is True


def test_ranks_broken_by_a_node_lost_whole_do_not_take_its_blame(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(spares, "SUSPECT_S", 1.5)
    port = free_port()
    server = _store(port, True)
    _, broken, _ = _seats(port)
    for node in range(3):
        server.add(f"hpctorch/spares-test/beat/{node}", 1)  # every node's watchdog beat once
    stop = threading.Event()

    def beating() -> None:  # node 0's watchdog goes on beating; node 2's stopped: it is gone, and never claims
        while not stop.wait(0.3):
            server.add("hpctorch/spares-test/beat/0", 1)

    beat = threading.Thread(target=beating, daemon=True)
    beat.start()
    try:
        broken.failed(object(), {0: _failure(0, 1)})  # the first to claim, its ranks broken on node 2's loss
    finally:
        stop.set()
        beat.join(timeout=10)
    assert broken.leaving is None
    assert "nid2 stopped beating (lost whole): a hot spare is for it; nid1 restarts in place" in capsys.readouterr().err
    assert server.add(broken.prefix + "used", 0) == 0  # the spare is left for node 0's watchdog to give to nid2's seat


def test_without_torch_s_round_every_node_of_a_round_keys_its_claim_alike() -> None:
    """torch's round lives in private state: where it moved, the round's rank 0 numbers the round
    from a job-wide counter in the round's own store, so a spare that moved in (fewer rounds of
    its own) claims under the same key as the nodes that were there from the start."""
    from torch.distributed import PrefixStore
    from torch.distributed.elastic.rendezvous import RendezvousInfo, RendezvousStoreInfo

    port = free_port()
    server = _store(port, True)  # noqa: F841
    first, second, spare = _seats(port)
    for seat in (first, second, spare):
        seat.handler = object()  # no _state_holder: as if torch renamed it
    for round_, seated in enumerate([(first, second), (first, spare)]):  # the spare moves in for round 1
        infos = [RendezvousInfo(PrefixStore(f"torch.rendezvous.test.{round_}", _store(port, False)), rank, 2,  # a client per node
                                RendezvousStoreInfo("127.0.0.1", port)) for rank in (0, 1)]
        readers = [threading.Thread(target=seated[1]._note_round, args=(infos[1],))]  # waits for rank 0's number
        readers[0].start()
        seated[0]._note_round(infos[0])
        readers[0].join(timeout=30)
        assert seated[0].round == seated[1].round == round_, (round_, seated[0].round, seated[1].round)
    assert spare.round == 1 and first.round == 1  # a count of the spare's own rounds would say 0


def test_a_planted_fault_claim_never_makes_a_node_leave(capsys) -> None:  # type: ignore[no-untyped-def]
    """A stranger who reaches the store names node 1 in the round's claim before node 1 claims:
    unsealed, it is not node 1's win (before, node 1 left the job for a spare on it)."""
    port = free_port()
    server = _store(port, True)
    _, node, _ = _seats(port)
    server.set(node.prefix + "fault/0", "1")
    node.failed(object(), {0: _failure(0, -9)})
    assert node.leaving is None
    assert server.add(node.prefix + "used", 0) == 0


def test_a_spare_moves_in_only_once_a_seated_node_sealed_ready() -> None:
    port = free_port()
    server = _store(port, True)
    seated, _, _ = _seats(port)
    spare = spares.Seat(_plan(2, 3, port), 1, 2, spare=True, host="nid2")
    spare.store, spare.seal = _store(port, False), _seal()
    server.set(spare.prefix + "ready", "1")  # planted
    assert not spare._ready()
    seated.sealed.set(seated.prefix + "ready", "1")
    assert spare._ready()


def test_node_0_watches_a_spare_by_its_sealed_slot_and_passes_over_a_planted_one() -> None:
    port = free_port()
    server = _store(port, True)
    sealed = authority.SealedStore(server, _seal())
    prefix = spares_prefix("spares-test")
    server.add(prefix + "in", 1)  # a stranger numbers itself first and plants slot 1: node 0 (its own) would be watched
    server.set(prefix + "in/1", "stranger")
    server.set(prefix + "in/1/node", "0")
    server.add(prefix + "in", 1)  # the spare that really moved in
    sealed.set(prefix + "in/2", "nid3")
    sealed.set(prefix + "in/2/node", "2")
    server.add("hpctorch/spares-test/beat/2", 1)
    judge = Judge(_plan(0, 3, port), spares=1)
    judge._watch_movers(server, sealed)
    assert judge.moved_seen == 2
    assert judge.movers == [("hpctorch/spares-test/beat/2", "nid3 (a hot spare that moved in)")]


def _slurm_node(monkeypatch: pytest.MonkeyPatch, node: int) -> None:
    """This process as node ``node`` of a 3-node Slurm step, one task per node (the variables srun sets)."""
    for name, value in {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "nid[1-3]", "SLURM_NNODES": "3", "SLURM_STEP_NODELIST": "nid[1-3]",
                        "SLURM_STEP_NUM_NODES": "3", "SLURM_NTASKS": "3", "SLURM_STEP_NUM_TASKS": "3", "SLURM_STEP_ID": "0",
                        "SLURM_STEP_TASKS_PER_NODE": "1(x3)", "SLURM_NODEID": str(node), "SLURM_PROCID": str(node), "SLURM_LOCALID": "0"}.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize("restarts", [0, 2])
def test_the_screen_s_spare_sits_out_or_waits_hot_and_the_kept_nodes_renumber(monkeypatch, capsys, restarts: int) -> None:  # type: ignore[no-untyped-def]
    """``--spare-nodes 1`` on 3 nodes, the middle one screened out: node 0 and node 2 run as ranks
    0 and 1 of 2 under the first kept node's address; the spare returns None (cold) or, with
    --max-restarts, a plan that puts it after the kept nodes and an unseated Seat (hot)."""
    import argparse
    import os

    from hpctorch.cli.screening import without_spares
    from hpctorch.plan.discover import plan_here
    from hpctorch.plan.types import Options
    from hpctorch.screen.exchange import Screened

    screened = Screened(findings=[{"node": 1, "host": "nid2", "measure": "screen", "detail": "the slowest"}], unmeasured=[],
                        seconds=1.0, spares=[1], master="127.0.0.2")
    args = argparse.Namespace(spare_nodes=1, quiet=False)
    outcomes = {}
    for node in range(3):
        _slurm_node(monkeypatch, node)
        options = Options(command=("python", "train.py"), nproc_per_node=1, max_restarts=restarts, master_addr="127.0.0.1", master_port=29400)
        outcomes[node] = without_spares(args, plan_here(options, os.environ, exchange=False), screened, options)
    said = capsys.readouterr().err
    for node, rank in ((0, 0), (2, 1)):
        plan, seat = outcomes[node]  # type: ignore[misc]
        assert (plan.node_rank, plan.nnodes, plan.nodes, plan.master_addr, plan.master_port) == (rank, 2, ("nid1", "nid3"), "127.0.0.2", 29400)
        assert [w.rank for w in plan.workers] == [rank]
        assert (seat is None) == (restarts == 0)
        if seat is not None:
            assert (seat.spare, seat.spares, seat.seats, seat.host) == (False, 1, 2, f"nid{node + 1}")
    assert "running on 2 of 3 nodes (nid[1,3]), world size 2, master 127.0.0.2" in said
    if restarts == 0:
        assert outcomes[1] is None and "nid2 sits out as a spare (the slowest)" in said
        return
    waiting, seat = outcomes[1]  # type: ignore[misc]
    assert (waiting.node_rank, waiting.nodes, waiting.master_addr) == (2, ("nid1", "nid3", "nid2"), "127.0.0.2")
    assert (seat.spare, seat.spares, seat.seats, seat.host, seat.joined) == (True, 1, 2, "nid2", False)
    assert "nid2 waits as a hot spare (the slowest)" in said and "hot spare: nid2" in said

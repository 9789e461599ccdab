"""The c10d rendezvous's completion wakes the node waiting for it (start.roundwake): two of torch's
own rendezvous handlers, as two nodes' agents, on a real TCPStore."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")

from torch.distributed import TCPStore  # noqa: E402
from torch.distributed.elastic.rendezvous import RendezvousParameters  # noqa: E402
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend  # noqa: E402
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler  # noqa: E402

from hpctorch.start import roundwake  # noqa: E402

HANG_S = 60.0


def _node(server: TCPStore, run_id: str):  # type: ignore[no-untyped-def]
    store = TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=HANG_S))
    params = RendezvousParameters(backend="c10d", endpoint=f"127.0.0.1:{server.port}", run_id=run_id, min_nodes=2,
                                  max_nodes=2, join_timeout=str(int(HANG_S)), local_addr="127.0.0.1")
    return create_handler(store, C10dRendezvousBackend(store, run_id), params)


def test_the_node_that_waits_is_woken_by_the_round_completing_not_by_its_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    assert roundwake.install()
    # Were the wake missing, the waiting node would sleep this long: the hang guard below ends first.
    monkeypatch.setattr(roundwake, "WAIT_S", 2 * HANG_S)
    waiting = threading.Event()
    original = roundwake.await_round

    def spy(holder, limit_s, node=None):  # type: ignore[no-untyped-def]
        if not holder.state.complete:
            waiting.set()
        return original(holder, limit_s, node)

    monkeypatch.setattr(roundwake, "await_round", spy)
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    first, second = _node(server, "wake"), _node(server, "wake")
    done = threading.Event()
    thread = threading.Thread(target=lambda: (first.next_rendezvous(), done.set()), daemon=True)
    thread.start()
    assert waiting.wait(HANG_S), "the first node never waited for the second"
    key = roundwake.completion_key(C10dRendezvousBackend(server, "wake"), 0)
    assert not server.check([key]), "a round with one of its two nodes was said complete"
    second.next_rendezvous()
    assert done.wait(HANG_S), "the waiting node was not woken when the round completed"
    assert server.check([key])


def test_a_completion_key_someone_else_set_costs_one_early_read_and_no_spin() -> None:
    assert roundwake.install()
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    backend = C10dRendezvousBackend(server, "planted")
    server.set(roundwake.completion_key(backend, 0), b"1")  # before any node arrives
    node = _node(server, "planted")
    node._state_holder.sync()
    assert roundwake.await_round(node._state_holder, HANG_S)  # the planted key: one early read...
    assert not roundwake.await_round(node._state_holder, HANG_S)  # ...then torch's own poll for that round


def test_on_a_restart_the_node_in_the_wait_list_is_woken_by_the_next_round_opening(monkeypatch: pytest.MonkeyPatch) -> None:
    # A restart: node A, first back, finds round 0 complete without it and waits in its wait list;
    # node B then leaves round 0 (round 1 opens) and joins round 1; A must hear of the opening.
    assert roundwake.install()
    monkeypatch.setattr(roundwake, "WAIT_S", 2 * HANG_S)
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    first, second = _node(server, "again"), _node(server, "again")
    joined = threading.Thread(target=first.next_rendezvous, daemon=True)
    joined.start()
    second.next_rendezvous()
    joined.join(HANG_S)  # round 0, both
    listed = threading.Event()
    original = roundwake.await_round

    def spy(holder, limit_s, node=None):  # type: ignore[no-untyped-def]
        if holder.state.complete and node in holder.state.wait_list:
            listed.set()
        return original(holder, limit_s, node)

    monkeypatch.setattr(roundwake, "await_round", spy)
    done = threading.Event()
    thread = threading.Thread(target=lambda: (first.next_rendezvous(), done.set()), daemon=True)
    thread.start()
    assert listed.wait(HANG_S), "the first node back never waited in the wait list"
    backend = C10dRendezvousBackend(server, "again")
    assert not server.check([roundwake.opening_key(backend, 1)])
    second.next_rendezvous()
    assert done.wait(HANG_S), "the node in the wait list was not woken when the next round opened"
    assert server.check([roundwake.opening_key(backend, 1), roundwake.completion_key(backend, 1)])

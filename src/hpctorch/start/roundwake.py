"""A node waiting in torch's c10d rendezvous learns of the event it waits for when it happens, not
at its next poll.

torch's rendezvous (``dynamic_rendezvous``) re-reads the shared state once a second while a node
waits (``_delay(seconds=1)``; the state it reads is cached for a second too). On a restart the
nodes arrive apart: the first to arrive finds the old round complete without it and waits in its
wait list for the next round to open (when the last node leaves the old one), then, joined, waits
for the round to complete; each wait ended up to a second late, and every rank's first collective
waited for it. Here the node whose write makes either event sets one key for it in the
rendezvous store (``<torch's key>/open/<round>``, ``<torch's key>/complete/<round>``), and a node
that would sleep checks that key instead, for at most torch's second, then reads the state afresh.
A check is a few bytes where torch's read is the whole state (every node's entry): the checks
come every ``check_every(nodes)`` seconds, so that all nodes together make at most
``STORE_CHECKS_PER_S`` of them (10,000 nodes: one a second each, as torch reads). Not the store's
own wait: one that times out is a warning on stderr from torch's C++ client, every second. Every
other wait (a spare in the redundancy list, the last call's deadline) is torch's as it was.
"""

from __future__ import annotations

import threading
import time
from typing import Any

TORCH_POLL_S = 1.0
"""The sleep torch asks for between reads of the state while a node waits."""
WAIT_S = 1.0
"""The longest a wait here lasts: torch's poll, so every other deadline is read as often as before."""
STORE_CHECKS_PER_S = 10_000
"""What all waiting nodes together ask of the store, at most (a check is a few bytes)."""
FASTEST_S = 0.02
"""The shortest time between a waiting node's checks, however few the nodes."""

_context = threading.local()
_installed = False


def install() -> bool:
    """Wrap torch's rendezvous for this process (the agent); False where torch's internals differ."""
    global _installed
    if _installed:
        return True
    try:
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rendezvous
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    except ImportError:
        return False
    executor, holder = rendezvous._DistributedRendezvousOpExecutor, rendezvous._BackendRendezvousStateHolder
    if not all(hasattr(owner, name) for owner, name in ((executor, "run"), (holder, "sync"), (rendezvous, "_delay"))):
        return False
    original_run, original_sync, original_delay = executor.run, holder.sync, rendezvous._delay

    def run(self, *args: Any, **kwargs: Any) -> Any:
        outer = getattr(_context, "executor", None)
        _context.executor = self
        try:
            return original_run(self, *args, **kwargs)
        finally:
            _context.executor = outer

    def sync(self) -> bool | None:  # type: ignore[no-untyped-def]
        # The state as last read or written: the one held now carries this node's changes already.
        before = getattr(self, "_hpctorch_synced", None)
        has_set = original_sync(self)
        if has_set and isinstance(getattr(self, "_backend", None), C10dRendezvousBackend):
            announce(self, before)
        self._hpctorch_synced = _round_of(getattr(self, "_state", None))
        return has_set

    def delay(seconds: float | tuple[float, float]) -> None:
        executor = getattr(_context, "executor", None)
        if seconds == TORCH_POLL_S and executor is not None:
            holder = getattr(executor, "_state_holder", None)
            backend = getattr(holder, "_backend", None)
            if isinstance(backend, C10dRendezvousBackend) and await_round(holder, WAIT_S, getattr(executor, "_node", None)):
                return
        original_delay(seconds)

    executor.run, holder.sync, rendezvous._delay = run, sync, delay
    _installed = True
    return True


def completion_key(backend: Any, round_: int) -> str:
    return f"{backend._key}/complete/{round_}"


def opening_key(backend: Any, round_: int) -> str:
    return f"{backend._key}/open/{round_}"


def _round_of(state: Any) -> tuple[int, bool] | None:
    if state is None:
        return None
    return (getattr(state, "round", -1), bool(getattr(state, "complete", False)))


def announce(holder: Any, before: tuple[int, bool] | None) -> list[str]:
    """After this node's write, the events it made, each said once by the node that made it: a
    round completed (the state it last read or wrote had that round incomplete, or an earlier
    one), or a new round opened (the last participant of a complete round left it: the nodes in
    its wait list join now). The keys set."""
    state, backend = holder._state, holder._backend
    if state.closed:
        return []
    keys = []
    if state.complete and before != (state.round, True):
        keys.append(completion_key(backend, state.round))
    elif not state.complete and before is not None and state.round > before[0]:
        keys.append(opening_key(backend, state.round))
    for key in keys:
        try:
            backend._store.set(key, b"1")
        except Exception:  # the nodes waiting read the state within torch's second anyway
            return []
    return keys


def check_every(nodes: int) -> float:
    """Seconds between a waiting node's checks: all ``nodes`` together make at most
    ``STORE_CHECKS_PER_S``, and none checks more often than every ``FASTEST_S`` or less than
    torch's poll."""
    return min(TORCH_POLL_S, max(FASTEST_S, nodes / STORE_CHECKS_PER_S))


def await_round(holder: Any, limit_s: float, node: Any = None) -> bool:
    """Wait at most ``limit_s`` for the event this node waits for: its round's completion, or, in
    the wait list of a complete round, the next round's opening. True when the wait was done here
    (its next read of the state is then fresh), False to leave it to torch's sleep."""
    state, backend = holder.state, holder._backend
    if state.closed:
        return False
    if not state.complete:
        key = completion_key(backend, state.round)
    elif node is not None and node in getattr(state, "wait_list", ()):
        key = opening_key(backend, state.round + 1)
    else:
        return False  # a spare in the redundancy list, or a state torch's poll reads best
    if getattr(holder, "_hpctorch_woken", None) == key:
        # Woken by this key, and the store's state says it has not happened: a key someone else
        # set (torch's store is open to all). One early read per event, then torch's poll.
        return False
    every = check_every(getattr(getattr(holder, "_settings", None), "max_nodes", 0) or STORE_CHECKS_PER_S)
    deadline = time.monotonic() + limit_s
    while True:
        try:
            if backend._store.check([key]):
                break
        except Exception:  # the store failed: torch's own read says how
            return True
        rest = deadline - time.monotonic()
        if rest <= 0:
            return True
        time.sleep(min(every, rest))
    holder._last_sync_time = -1  # torch serves a read within a second of the last from its cache
    holder._hpctorch_woken = key
    return True

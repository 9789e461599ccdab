"""A node whose workers finished leaves torch's exit barrier when another node asks for a restart.

torch's agent, its workers done, waits for every node's agent to finish too (its exit barrier,
``exit_barrier_timeout``: 300 s). A node whose workers failed meanwhile asks torch's rendezvous
for a new round and waits there for the finished nodes, which never come: the job hangs for the
barrier's five minutes (torchrun's too) and then fails. A restart needs every node's workers, so
a node that waits in the rendezvous (its wait list) while this node's workers have finished
means the job cannot go on: this node leaves the barrier at once, its agent closes the
rendezvous as torch's agent does at its end, and the node waiting learns it there
(``RendezvousClosedError``) and ends the job with its own failure.

The barrier is torch's own (``utils.store._barrier_nonblocking``: a counter, and the key the last
node sets), its key checked every ``check_every(nodes)`` seconds, and the rendezvous's wait list
read every ``WAIT_LIST_EVERY_S`` (as torch's agent reads it every second while workers run). Where
torch lacks those pieces the barrier is torch's, unchanged.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from .roundwake import check_every

WAIT_LIST_EVERY_S = 1.0
_installed = False


def install() -> bool:
    """Replace torch's exit barrier in this process (the agent); False where torch's differs."""
    global _installed
    if _installed:
        return True
    try:
        from torch.distributed.elastic.agent.server import api
        from torch.distributed.elastic.utils import store as store_util
    except ImportError:
        return False
    agent, prefix = api.SimpleElasticAgent, getattr(api, "_TERMINAL_STATE_SYNC_ID", None)
    if not hasattr(agent, "_exit_barrier") or prefix is None or not hasattr(store_util, "_barrier_nonblocking"):
        return False
    original = agent._exit_barrier

    def exit_barrier(self) -> None:  # type: ignore[no-untyped-def]
        try:
            group = self._worker_group
            store, nodes, rendezvous, timeout = self._store, group.group_world_size, group.spec.rdzv_handler, self._exit_barrier_timeout
        except AttributeError:
            return original(self)
        self._in_exit_barrier = True
        try:
            if wait(store, store_util._barrier_nonblocking, prefix, nodes, rendezvous, timeout) == "restart asked":
                print(f"hpctorch: node {getattr(group, 'group_rank', '?')}'s workers finished, and another node asks for a "
                      "restart, which needs every node's workers: the job cannot go on (that node ends it with its failure)",
                      file=sys.stderr, flush=True)
        finally:
            self._in_exit_barrier = False

    agent._exit_barrier = exit_barrier
    _installed = True
    return True


def wait(store: Any, check_in: Any, prefix: str, nodes: int, rendezvous: Any, timeout_s: float) -> str:
    """Check in, then wait for every node (``"all finished"``), a node of this round asking for a
    new one (``"restart asked"``), the timeout (``"timed out"``) or a store that fails (``"store
    failed"``: torch's barrier ends on any error too)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    deadline = time.monotonic() + timeout_s
    every = check_every(nodes)
    try:
        last = check_in(store=store, world_size=nodes, key_prefix=prefix)
        next_read = time.monotonic() + WAIT_LIST_EVERY_S
        while time.monotonic() < deadline:
            if store.check([last]):
                return "all finished"
            if time.monotonic() >= next_read:
                if rendezvous.num_nodes_waiting() > 0 and _round_lost_a_node(rendezvous, nodes):
                    return "restart asked"
                next_read = time.monotonic() + WAIT_LIST_EVERY_S
            time.sleep(max(0.0, min(every, deadline - time.monotonic())))
    except SignalException:
        raise  # torch's agent stops its workers and exits on it, as from its own barrier
    except Exception:  # torch's barrier logs and ends on any error; the agent goes on to its end
        return "store failed"
    return "timed out"


def _round_lost_a_node(rendezvous: Any, nodes: int) -> bool:
    """Whether a node of this round left it (a node restarting leaves the round's participants,
    then waits for the next); a node merely arriving late (an elastic job) leaves it whole.
    Where torch's state cannot be read, a node waiting is taken as one restarting."""
    state = getattr(getattr(rendezvous, "_state_holder", None), "state", None)
    participants = getattr(state, "participants", None)
    return participants is None or len(participants) < nodes

"""Hot spares (``--spare-nodes K --max-restarts R``): the K spare nodes wait in torch's c10d
rendezvous, in the list it keeps of nodes beyond ``max_nodes`` (its redundancy list), and one
takes the place of a node whose rank failed.

torch has the mechanism and no policy: a node whose workers fail restarts in place and rejoins;
a participant that leaves lets a waiting node in, and every agent restarts its workers in a new
round; an agent that exits normally closes the rendezvous for everyone (launch_agent's
shutdown), one that dies of a signal does not. The policy lives in the rendezvous backend
``hpctorch-spares``, torch's own c10d handler with two of its methods wrapped:
- a spare joins only once the first round is complete: earlier, it could take a kept node's seat;
- when workers fail, each failed node claims the round's fault in the master's store
  (``compare_set`` of ``spares/fault/<round>``). The node whose rank failed first claims first:
  its peers' collectives break only after it (and a rank killed by a signal claims at once, a
  rank that exited a second later, so a death outranks the errors it causes). Unless it serves the store (the master cannot be
  replaced) or no spare is left, that node leaves the rendezvous instead of rejoining, marks its
  watchdog slot ``replaced`` and exits 0; a spare moves in and every node restarts in a new round;
- a node lost whole (its hpctorch gone) never claims: a node whose ranks merely exited first
  watches the others' watchdog counters for ``SUSPECT_S`` and restarts in place when one stopped;
  node 0's watchdog, instead of ending the job, marks the silent node replaced and torch's
  rendezvous drops it when its heartbeats stop, which lets the spare in;
- a spare that was never needed leaves when the job ends (the closed rendezvous, or the
  watchdog's verdict, its SIGTERM) and exits 0.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass

from ..guard.keys import DONE, REPLACED, beat_key, spares_prefix
from ..plan.types import Plan

BACKEND = "hpctorch-spares"
POLL_S = 0.5
RAISED_WAIT_S = 1.0
"""How long a node whose ranks exited (rather than died of a signal) waits before it claims the
round's fault: a peer's rank killed outright (the OOM killer, a bus error) is the cause, and the
ranks whose collectives broke on it exit through Python's error path (or abort, as NCCL's
watchdog does), maybe as fast as its agent notices."""
SUSPECT_S = 5.0
"""How long a node whose ranks exited watches its peers' watchdog counters (a beat every 2 s)
before it leaves: a peer lost whole (its hpctorch gone, so it never claims) broke those ranks, and
it is the one to replace (node 0's watchdog hands its seat to a spare once it is silent)."""
ROUND_KEY = "hpctorch-spares-round"
"""In a round's own store: the round's number, where torch's is not readable (``Seat._agreed_round``)."""
LEAVE_S = 10.0
"""How long a replaced node tries to leave the rendezvous; past it, torch drops the node when its
heartbeats stop (keep-alive interval times attempts: 15 s by default)."""

_seat: Seat | None = None
"""This process's seat: torch's registry calls the backend's creator with parameters alone."""


class Replaced(Exception):
    """This node's rank failed first and a spare takes its place: it leaves the job.
    ``exit_code``: the failed worker's (negative: the signal that killed it)."""

    def __init__(self, line: str, exit_code: int) -> None:
        super().__init__(line)
        self.exit_code = exit_code


class SpareDone(Exception):
    """The job ended (or this spare was stopped) before it needed this spare."""


@dataclass
class Seat:
    """This node's part in a job with hot spares."""

    plan: Plan
    spares: int
    """K: how many nodes wait as spares."""
    seats: int
    """The nodes the job runs on (torch's min and max nodes)."""
    spare: bool
    """This node waits as a spare."""
    host: str
    joined: bool = False
    """This node has a seat (a kept node from the start, a spare once it moved in)."""
    leaving: tuple[str, int] | None = None
    """Why this node leaves (its failed rank, its exit code), once it claimed a fault and a spare was left."""
    round: int = -1
    store = None  # type: ignore[no-untyped-def]
    seal = None  # type: ignore[no-untyped-def]
    """This run's seal (``guard.authority``): the fault claim, ``ready`` and a spare's slot are
    sealed, so a stranger who reaches the store cannot make a node leave or name a slot."""
    handler = None  # type: ignore[no-untyped-def]

    def __post_init__(self) -> None:
        self.joined = not self.spare
        self.prefix = spares_prefix(self.plan.run_id)
        self._claimed: set[int] = set()

    @property
    def sealed(self):  # type: ignore[no-untyped-def]
        from ..guard.authority import SealedStore

        return SealedStore(self.store, self.seal)

    # -- the fault ------------------------------------------------------------------------------

    def failed(self, context: object, failures: Mapping[int, object]) -> None:
        """torch's process context saw ``failures`` (local rank -> ProcessFailure) on this node:
        claim the round's fault, once per round (torch closes a context twice: its poll, the agent)."""
        if not failures or not self.joined or self.store is None or self.round in self._claimed:
            return
        self._claimed.add(self.round)
        first = min(failures.values(), key=lambda f: getattr(f, "timestamp", 0))
        why = describe(first)
        me = str(self.plan.node_rank).encode()
        killed = _killed(first)
        if not killed:
            time.sleep(RAISED_WAIT_S)
        try:
            # A claim there that does not check (planted) raises: this node restarts in place.
            won = self.sealed.compare_set(f"{self.prefix}fault/{self.round}", "", me) == me
            if not won:
                return  # a peer's rank failed first: this node's ranks broke on it, and restart
            lost = [] if killed else self._lost_peers()
            if lost:
                _say(f"{', '.join(lost)} stopped beating (lost whole): a hot spare is for it; {self.host} restarts in place ({why})")
                return
            if self.plan.is_master:
                _say(f"{self.host} cannot be replaced by a spare (it serves the job's store): it restarts in place ({why})")
                return
            if self.store.add(f"{self.prefix}used", 1) > self.spares:
                _say(f"no spare left to replace {self.host}: it restarts in place ({why})")
                return
        except Exception:  # noqa: BLE001 - the store's host may be gone: torch's restart reports it
            return
        self.leaving = (why, int(getattr(first, "exitcode", 1)))

    def _lost_peers(self) -> list[str]:
        """The other seated nodes whose watchdog counter did not move for ``SUSPECT_S``."""
        beats = {n: beat_key(self.plan.run_id, n) for n in range(self.seats) if n != self.plan.node_rank}
        if not beats or not self.store.check(list(beats.values())):  # type: ignore[union-attr]
            return []
        before = self.store.multi_get(list(beats.values()))  # type: ignore[union-attr]
        time.sleep(SUSPECT_S)
        after = self.store.multi_get(list(beats.values()))  # type: ignore[union-attr]
        return [self.plan.nodes[n] if n < len(self.plan.nodes) else f"node {n}"
                for n, old, new in zip(beats, before, after) if old == new and new not in (DONE, REPLACED)]

    # -- torch's handler, wrapped -----------------------------------------------------------------

    def next_rendezvous(self, original):  # type: ignore[no-untyped-def]
        if self.leaving is not None:
            self._leave()
            raise Replaced(*self.leaving)
        if not self.joined:
            return self._move_in(original)
        info = original()
        self._note_round(info)
        self.sealed.set(f"{self.prefix}ready", "1")  # the round is complete: spares may join now
        return info

    def shutdown(self, original) -> bool:  # type: ignore[no-untyped-def]
        """Close the rendezvous only as a seated node that ends with the job: a node that leaves
        for a spare, or a spare never needed, would close it for everyone."""
        if self.leaving is not None or not self.joined:
            try:
                self.handler._stop_heartbeats()  # type: ignore[union-attr]
            except Exception:  # noqa: BLE001 - torch's private method: its heartbeats then stop with the process
                pass
            return True
        return original()

    def _move_in(self, original):  # type: ignore[no-untyped-def]
        from torch.distributed.elastic.rendezvous import RendezvousError

        try:
            while not self._ready():
                time.sleep(POLL_S)
        except SpareDone:
            raise
        except Exception as exc:  # noqa: BLE001 - torch's store errors vary by version: the job's store is gone
            raise SpareDone(f"the job's store is gone: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}") from None
        try:
            info = original()
        except RendezvousError as exc:  # closed (the job ended), graceful exit, or the store gone
            raise SpareDone(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__) from None
        self.joined = True
        self._note_round(info)
        try:
            index = self.store.add(f"{self.prefix}in", 1)  # type: ignore[union-attr]
            self.sealed.set(f"{self.prefix}in/{index}", self.host)
            # Its watchdog slot: node 0 watches it from now on, as the seat it took.
            self.sealed.set(f"{self.prefix}in/{index}/node", str(self.plan.node_rank))
        except Exception:  # noqa: BLE001 - node 0's summary misses its name, and its watch this node
            pass
        _say(f"{self.host} moves in from the spares: the job goes on in round {self.round} of torch's rendezvous")
        return info

    def _ready(self) -> bool:
        """The first round is complete, as a seated node sealed it (a planted ``ready`` is not)."""
        from ..guard.authority import AuthError

        ready = f"{self.prefix}ready"
        if not self.store.check([ready]):  # type: ignore[union-attr]
            return False
        try:
            self.sealed.get(ready)
            return True
        except AuthError:
            return False  # a seated node's set replaces it

    def _leave(self) -> None:
        """Out of the participants at once, so the spare moves in now, not when the heartbeats expire."""
        handler = self.handler
        try:
            from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousExitOp

            handler._stop_heartbeats()  # type: ignore[union-attr]
            handler._op_executor.run(_RendezvousExitOp(), time.monotonic() + LEAVE_S)  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - torch's private parts moved: its heartbeat expiry drops the node
            pass

    def _note_round(self, info) -> None:  # type: ignore[no-untyped-def]
        """The round every node of it keys its fault claim by: torch's own number, else one the
        round's rank 0 draws from a job-wide counter and leaves in the round's own store (torch
        prefixes it by round), where every node of the round reads the same."""
        try:
            self.round = int(self.handler._state_holder.state.round)  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - torch's private state moved: the agreed number
            self.round = self._agreed_round(info)

    def _agreed_round(self, info) -> int:  # type: ignore[no-untyped-def]
        store, rank = (info.store, info.rank) if hasattr(info, "store") else (info[0], info[1])  # torch < 2.3: a tuple
        try:
            if rank == 0:
                number = int(self.store.add(f"{self.prefix}rounds", 1)) - 1  # type: ignore[union-attr]
                store.set(ROUND_KEY, str(number))
                return number
            return int(store.get(ROUND_KEY))  # waits for the round's rank 0 (the store's own timeout)
        except Exception:  # noqa: BLE001 - the store is gone: torch's restart reports it
            return self.round + 1


def _killed(failure: object) -> bool:
    """Killed from outside (the OOM killer, a bus error, a segfault), not on an error path of its
    own: SIGABRT is how torch and NCCL end a process on an error (a peer's broken collective too)."""
    code = int(getattr(failure, "exitcode", 1))
    return code < 0 and -code != int(signal.SIGABRT)


def describe(failure: object) -> str:
    """One failed worker, as a line says it: ``local rank 1 died of SIGKILL``."""
    code = int(getattr(failure, "exitcode", 1))
    local = getattr(failure, "local_rank", "?")
    if code < 0:
        try:
            how = f"died of {signal.Signals(-code).name}"
        except ValueError:
            how = f"was killed by signal {-code}"
    else:
        how = f"exited with code {code}"
    return f"its local rank {local} {how}"


def _say(line: str) -> None:
    print(f"hpctorch: {line}", file=sys.stderr, flush=True)


def seat_for(seat: Seat) -> None:
    """Make ``seat`` this process's, and the ``hpctorch-spares`` backend torch's (once)."""
    global _seat
    _seat = seat
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(BACKEND, _create)  # the same creator again is allowed


def _create(params):  # type: ignore[no-untyped-def]
    """torch's c10d handler, as torch's registry makes it, with the seat's policy wrapped in."""
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    seat = _seat
    assert seat is not None, "seat_for() before the launch"
    backend, store = create_backend(params)
    handler = create_handler(store, backend, params)
    seat.store, seat.handler = store, handler
    seat.seal = _run_seal(store, seat.plan, params.endpoint)
    next_rendezvous, shutdown = handler.next_rendezvous, handler.shutdown
    handler.next_rendezvous = lambda: seat.next_rendezvous(next_rendezvous)
    handler.shutdown = lambda: seat.shutdown(shutdown)
    handler.get_backend = lambda: BACKEND  # torch's registry checks the name it was asked for
    return handler


def _run_seal(store, plan: Plan, endpoint: str):  # type: ignore[no-untyped-def]
    """The run's seal: node 0's own where this process published it, else node 0's record in
    the rendezvous' store, authenticated (this node's hpctorch did it before the agent started;
    a failure here stops the node in one line)."""
    from dataclasses import replace

    from ..guard import authority

    host, _, port = endpoint.rpartition(":")
    return authority.run_seal(store, replace(plan, master_addr=host, master_port=int(port)), plan.rdzv_timeout)


def stop_waiting(_signum: int, _frame: object) -> None:
    """A waiting spare's SIGTERM (its watchdog's verdict, the scheduler): leave torch's join loop.
    Once workers run, torch's own handler replaces this one."""
    raise SpareDone("stopped while it waited")

"""The tree that spreads node 0's pack: node i receives from node (i-1)//k and forwards to nodes
k*i+1 .. k*i+k as the bytes arrive, so the pack leaves node 0 k times whatever the node count and
reaches the last node after log_k(N) hops. Each node finds its parent's address through the
job's store (one key per node with children). A child proves it belongs to the job with the
token node 0 put in the store, and names itself.

No node waits on another's disk or link: a node with children keeps the bytes as they arrive in
a spool of its own (node 0: its pack), and each child is sent them by a thread of its own, at
the child's pace, while the node extracts its own copy at its disk's. A node whose own copy
fails still forwards.

Every wait is bounded by the node's deadline (``HPCTORCH_STAGE_TIMEOUT_S``), its own extraction
included: a parent that sends nothing for ``IDLE_S``, or a child that takes nothing for as long,
is gone, and a child still short of the pack at the deadline is cut off. So is a child with
children of its own that cannot keep up: one that leaves bytes its parent has untaken and, at
the better of its pace over the last seconds and over the whole transfer, would end past the
deadline; its parent marks it cut in the store (``cut/<node>``), and it runs from the shared
path (``=try``) or stops the job, saying why.

No node's subtree goes down with it: a node whose parent went away, sent nothing, never came,
or was cut asks its grandparent (then the next ancestor up) for the bytes from the one it had,
and says so in a line; a node takes in any node of its subtree that asks, once.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from ..errors import HpctorchError
from .feed import Feed, Upstream
from .relay import Relay
from .tree import (CHUNK, FANOUT, IDLE_S, JOIN_SLACK_S, LateError, Spool, SpreadError, ancestors_of, children_of, depth_of,
                   parent_of)

__all__ = ["CHUNK", "FANOUT", "IDLE_S", "Feed", "LateError", "Part", "Relay", "Spool", "SpreadError", "Upstream", "ancestors_of",
           "children_of", "depth_of", "parent_of", "take_part", "wait_for"]


def _spooled(source: Iterable[bytes], size: int, folder: str | None, helpers: list[threading.Thread]) -> Spool:
    """Node 0's pack given as chunks (tests, benchmarks): spooled by a thread as they come."""
    spool = Spool.empty(folder, size)

    def feed() -> None:
        try:
            for chunk in source:
                spool.append(memoryview(chunk))
            if spool.written != size:
                spool.fail(f"node 0's pack held {spool.written} of {size} bytes")
        except (OSError, SpreadError) as exc:
            spool.fail(f"node 0 could not read its pack: {exc}")

    helpers.append(threading.Thread(target=feed, daemon=True, name="hpctorch-stage-pack"))
    helpers[-1].start()
    return spool


Consume = Callable[[Iterator[bytes]], None]
"""What a node does with the pack for its own copy: reads every chunk, at its own pace."""


def take_part(store, prefix: str, node: int, nnodes: int, host: str, token: str, size: int, consume: Consume | None,  # type: ignore[no-untyped-def]
              source: str | Iterable[bytes] | None = None, fanout: int = FANOUT, deadline: float | None = None,
              accept_s: float = 30.0, idle_s: float = IDLE_S, spool_dir: str | None = None,
              tick: Callable[[int], None] | None = None, say: Callable[[str], None] | None = None,
              name_of: Callable[[int], str] | None = None) -> Part:
    """A node's part in spreading ``size`` bytes: node 0 reads ``source`` (its pack's path, or
    chunks), every other node its parent (found at ``<prefix>addr/<parent>`` in ``store``), or
    the nearest ancestor left when that parent fails it (``say`` hears of each such move); the
    children (who connect within ``accept_s``) are sent every byte, and ``consume`` (None: this
    node has its copy) reads them too. Returns once its own copy and every child are done or
    dropped, by ``deadline``, the part still serving nodes below whose parent failed them until it
    is closed; raises the node's own failure (a SpreadError, or ``consume``'s) only after its
    children were served. A node with children keeps the bytes in ``spool_dir``."""
    deadline = time.monotonic() + 3600.0 if deadline is None else deadline
    # The store's client is one connection: the senders and the feed share it, and once this
    # returns the caller has it back (``done``): what still runs then asks it nothing.
    talking, done = threading.Lock(), threading.Event()

    def address_of(ancestor: int, until: float, alone: bool) -> str:
        if done.is_set():
            raise SpreadError("its part in the spread was over")
        # Alone (no thread of this node's has started yet): one wait the server holds; later, a check at a time.
        try:
            return wait_for(store, f"{prefix}addr/{ancestor}", until, f"node {ancestor}'s address (its parent in the tree)",
                            None if alone else talking, done)
        except HpctorchError as exc:  # a record this job did not seal: its parent's stops the node as before, an ancestor's is passed over
            if alone:
                raise
            raise SpreadError(exc.line()) from None

    def cut_off(child: int, why: str) -> None:
        try:
            with talking:
                if not done.is_set():
                    store.set(f"{prefix}cut/{child}", why)
        except RuntimeError:
            pass  # the child then looks for another parent, which judges it as this one did

    def was_cut() -> str | None:
        try:
            with talking:
                if done.is_set() or not store.check([f"{prefix}cut/{node}"]):
                    return None
                return store.get(f"{prefix}cut/{node}").decode()
        except (RuntimeError, HpctorchError):  # a cut this job did not seal is no cut: the node asks the next node up
            return None

    relay = Relay(node, nnodes, host, token, fanout, idle_s, on_cut=cut_off, name_of=name_of)
    part = Part(relay, deadline)
    try:
        if relay.children:
            with talking:
                store.set(f"{prefix}addr/{node}", relay.address)
        if source is not None:
            part.spool = Spool.whole(source, size) if isinstance(source, str) else _spooled(source, size, spool_dir, part.helpers)
            chunks = part.spool.chunks(deadline)
        else:
            part.feed = Feed(node, fanout, token, idle_s, address_of, was_cut, say, deadline, max(accept_s, 1.0), name_of)
            if consume is None and not relay.children:
                part.close()
                return part  # taken by the parent at once, then dropped at its first send
            if relay.children:
                part.spool = Spool.empty(spool_dir, size)
                part.helpers.append(threading.Thread(target=part.feed.fill, args=(part.spool, deadline), daemon=True,
                                                     name="hpctorch-stage-from-parent"))
                part.helpers[-1].start()
                chunks = part.spool.chunks(deadline)
            else:
                chunks = part.feed.chunks(size, deadline)
        relay.accept(min(deadline, time.monotonic() + accept_s))
        if part.spool is not None:
            relay.serve(part.spool, deadline)
        try:
            if consume is not None:
                consume(_ticking(chunks, relay, tick) if tick is not None else chunks)
        finally:  # its own copy failed or not, its children get every byte it gets
            relay.wait(deadline, tick)
    except BaseException:
        with talking:
            done.set()  # first: the threads that close() joins must not talk to the store the caller gets back
        part.close()
        raise
    finally:
        with talking:
            done.set()
    return part


class Part:
    """What a node's part leaves running once its own copy and its children are done: its relay,
    taking in any node of its subtree whose parent failed it, until ``close`` (once every node
    is done: the job's verdict)."""

    def __init__(self, relay: Relay, deadline: float) -> None:
        self.relay, self.deadline = relay, deadline
        self.feed: Feed | None = None
        self.spool: Spool | None = None
        self.helpers: list[threading.Thread] = []
        self.closed = False

    def __enter__(self) -> Part:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.relay.close()
        if self.feed is not None:
            self.feed.stop()  # wakes a fill still waiting: its children are served or dropped
        for helper in self.helpers:
            helper.join(max(0.0, self.deadline - time.monotonic()) + JOIN_SLACK_S)
        if self.feed is not None:
            self.feed.close()  # after the fill ended: it never meets a closed socket
        if self.spool is not None and not any(thread.is_alive() for thread in [*self.helpers, *self.relay.senders]):
            self.spool.close()  # else left open: a thread still writing or sending must never meet a reused descriptor


def _ticking(chunks: Iterator[bytes], relay: Relay, tick: Callable[[int], None]) -> Iterator[bytes]:
    for chunk in chunks:
        tick(relay.least_sent())
        yield chunk


def wait_for(store, key: str, deadline: float, what: str, talking: threading.Lock | None = None,  # type: ignore[no-untyped-def]
             done: threading.Event | None = None) -> str:
    """``key``'s value once it is set, within ``deadline``; else SpreadError naming ``what``.
    With ``talking`` (the lock of a client other threads use too), held only a moment at a time,
    and the client left alone once ``done`` is set."""
    left = max(1.0, deadline - time.monotonic())
    try:
        if talking is None:
            store.wait([key], datetime.timedelta(seconds=left))
            return store.get(key).decode()
        pause = 0.05
        while True:
            with talking:
                if done is not None and done.is_set():
                    raise RuntimeError(key)
                if store.check([key]):
                    return store.get(key).decode()
            if time.monotonic() >= deadline:
                raise RuntimeError(key)
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 1.0)
    except RuntimeError:  # torch's store timeout and lost connection (DistStoreError, DistNetworkError)
        raise SpreadError(f"waited {left:.0f} s for {what}") from None

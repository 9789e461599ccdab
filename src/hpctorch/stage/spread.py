"""The tree that spreads node 0's pack: node i receives from node (i-1)//k and forwards each
chunk to nodes k*i+1 .. k*i+k as it arrives, so the pack leaves node 0 k times whatever the node
count and reaches the last node after log_k(N) hops of one chunk each. Each node finds its
parent's address through the job's store (one key per node with children). A child proves it
belongs to the job with the token node 0 put in the store, and names itself.

No node waits on another's disk or CPU: each chunk that arrives goes to every child's lane and to
this node's own unpacking lane at once, and threads of their own drain them; the node reads on as
fast as its fastest child takes the bytes (its own use, when it has no child left). A child that
falls ``BEHIND`` bytes behind the fastest is cut off (its subtree with it, each of those nodes
says so); this node's own unpacking that falls as far behind is given up (the node runs from the
shared path under ``=try``) while it goes on forwarding. Every wait is bounded by the node's
deadline (its whole part, its own unpacking included), and a parent that sends nothing for
``IDLE_S`` is gone.
"""

from __future__ import annotations

import collections
import datetime
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator

FANOUT = 4
CHUNK = 1 << 20
IDLE_S = 60.0
HELLO_S = 5.0
BEHIND = 64 * CHUNK
"""How far a child, or this node's own unpacking, may fall behind the fastest of them before it
is cut off (given up): the memory a node lends a slow neighbour, never time."""
AHEAD = 8 * CHUNK
"""What a node reads ahead of its fastest lane (its reading is paced by that lane, no slower one)."""


class SpreadError(Exception):
    """This node could not receive the pack; the message names whom and why."""


def parent_of(node: int, fanout: int = FANOUT) -> int:
    return (node - 1) // fanout


def children_of(node: int, nnodes: int, fanout: int = FANOUT) -> list[int]:
    first = node * fanout + 1
    return list(range(first, min(nnodes, first + fanout)))


def depth_of(nnodes: int, fanout: int = FANOUT) -> int:
    """Hops from node 0 to the last node."""
    depth, node = 0, nnodes - 1
    while node > 0:
        node, depth = parent_of(node, fanout), depth + 1
    return depth


class Relay:
    """A node's side of the tree towards its children: listen, take each child once, forward."""

    def __init__(self, node: int, nnodes: int, host: str, token: str, fanout: int = FANOUT, idle_s: float = IDLE_S) -> None:
        self.children = children_of(node, nnodes, fanout)
        self.token = token
        self.idle_s = idle_s
        self.sockets: dict[int, socket.socket] = {}
        self.dropped: dict[int, str] = {}
        self.listener: socket.socket | None = None
        self.host = host
        if self.children:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self.listener = socket.create_server((host, 0), family=family, backlog=2 * fanout + 8)

    @property
    def address(self) -> str:
        assert self.listener is not None
        return f"{self.host}:{self.listener.getsockname()[1]}"

    def accept(self, deadline: float) -> None:
        """Take every child that connects with the job's token, until all did or ``deadline``."""
        while self.listener is not None and len(self.sockets) < len(self.children):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.listener.settimeout(left)
            try:
                conn, _ = self.listener.accept()
            except (TimeoutError, socket.timeout):
                break
            child = self._hello(conn)
            if child is None:
                conn.close()
                continue
            conn.settimeout(self.idle_s)
            self.sockets[child] = conn
        for child in self.children:
            if child not in self.sockets and child not in self.dropped:
                self.dropped[child] = "never connected"

    def _hello(self, conn: socket.socket) -> int | None:
        conn.settimeout(HELLO_S)
        line = b""
        try:
            while not line.endswith(b"\n") and len(line) < 256:
                part = conn.recv(256 - len(line))
                if not part:
                    return None
                line += part
        except OSError:
            return None
        fields = line.decode(errors="replace").split()
        if len(fields) != 2 or fields[0] != self.token or not fields[1].isdigit():
            return None
        child = int(fields[1])
        return child if child in self.children and child not in self.sockets else None

    def start(self, room: threading.Condition) -> None:
        """A sender per child taken, each draining its own lane."""
        self.lanes = {child: Lane(room) for child in self.sockets}
        self.senders = [threading.Thread(target=self._send, args=(child,), name=f"hpctorch-stage-child{child}", daemon=True)
                        for child in self.sockets]
        for sender in self.senders:
            sender.start()

    def _send(self, child: int) -> None:
        conn, lane = self.sockets[child], self.lanes[child]
        try:
            for chunk in lane.drain():
                conn.sendall(chunk)
            conn.shutdown(socket.SHUT_WR)
        except OSError as exc:  # gone, took nothing for idle_s, or cut off: its subtree says so itself
            self.dropped.setdefault(child, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
            lane.cut()
        finally:
            conn.close()

    def forward(self, chunk: bytes) -> None:
        """``chunk`` into every child's lane, without waiting."""
        for child, lane in getattr(self, "lanes", {}).items():
            if child not in self.dropped:
                lane.put(chunk)

    def cut_behind(self, lead: int) -> None:
        """Cut off every child that took ``BEHIND`` bytes less than ``lead`` (the fastest lane's)."""
        for child, lane in getattr(self, "lanes", {}).items():
            if child not in self.dropped and lane.open and lead - lane.taken > BEHIND:
                self.dropped[child] = f"fell {BEHIND >> 20} MiB behind the fastest of its parent's lanes: cut off"
                self._cut(child)

    def _cut(self, child: int) -> None:
        self.lanes[child].cut()
        try:
            self.sockets[child].shutdown(socket.SHUT_RDWR)  # a sender blocked in sendall returns
        except OSError:
            pass

    def finish(self, deadline: float) -> None:
        """Every child's lane sent (until ``deadline``: a child still taking bytes then is cut off)."""
        for lane in getattr(self, "lanes", {}).values():
            lane.end()
        for sender in getattr(self, "senders", []):
            sender.join(max(0.0, deadline - time.monotonic()))
        for child, lane in getattr(self, "lanes", {}).items():
            if not lane.drained.is_set() and child not in self.dropped:
                self.dropped[child] = "still taking the pack at its parent's deadline: cut off"
                self._cut(child)

    def close(self) -> None:
        for child in list(getattr(self, "lanes", {})):
            self._cut(child)
        for conn in self.sockets.values():
            conn.close()
        self.sockets.clear()
        if self.listener is not None:
            self.listener.close()
            self.listener = None


class Lane:
    """Chunks from one thread to another. ``put`` never waits; ``taken`` counts the bytes the
    reader took out, so the writer can pace itself by its fastest lane and cut off one that fell
    ``BEHIND`` it; ``drain`` yields until ``end`` or ``cut`` (then OSError)."""

    def __init__(self, room: threading.Condition | None = None) -> None:
        self.room = room
        """Told whenever this lane takes a chunk out: the writer waits on it for its fastest lane."""
        self.chunks: collections.deque[bytes] = collections.deque()
        self.held = self.taken = 0
        self.ended = self.was_cut = False
        self.ready = threading.Condition()
        self.drained = threading.Event()

    @property
    def open(self) -> bool:
        return not self.was_cut and not self.ended

    def put(self, chunk: bytes) -> None:
        with self.ready:
            if self.was_cut:
                return
            self.chunks.append(chunk)
            self.held += len(chunk)
            self.ready.notify()

    def end(self) -> None:
        with self.ready:
            self.ended = True
            self.ready.notify()

    def cut(self) -> None:
        with self.ready:
            self.was_cut = True
            self.chunks.clear()
            self.held = 0
            self.ready.notify()

    def drain(self) -> Iterator[bytes]:
        while True:
            with self.ready:
                while not self.chunks and not self.ended and not self.was_cut:
                    self.ready.wait()
                if self.was_cut:
                    raise OSError("cut off")
                if not self.chunks:
                    self.drained.set()
                    return
                chunk = self.chunks.popleft()
                self.held -= len(chunk)
                self.taken += len(chunk)
            if self.room is not None:
                with self.room:
                    self.room.notify_all()
            yield chunk


class Upstream:
    """A node's side of the tree towards its parent: connect and name itself at once (the parent
    takes its children before it forwards a byte), then the pack's bytes, chunk by chunk."""

    def __init__(self, address: str, token: str, node: int, idle_s: float = IDLE_S) -> None:
        self.address = address
        self.idle_s = idle_s
        host, _, port = address.rpartition(":")
        try:
            self.conn = socket.create_connection((host, int(port)), timeout=idle_s)
            self.conn.sendall(f"{token} {node}\n".encode())
        except (OSError, ValueError) as exc:
            raise SpreadError(f"cannot reach its parent at {address}: {getattr(exc, 'strerror', None) or exc}") from None

    def chunks(self, size: int, deadline: float | None = None) -> Iterator[bytes]:
        got = 0
        try:
            while got < size:
                left = self.idle_s if deadline is None else min(self.idle_s, deadline - time.monotonic())
                if left <= 0:
                    raise SpreadError(f"the pack was not here by the deadline ({got} of {size} bytes from its parent at {self.address})")
                self.conn.settimeout(left)
                try:
                    chunk = self.conn.recv(min(CHUNK, size - got))
                except (TimeoutError, socket.timeout):
                    if deadline is not None and time.monotonic() >= deadline:
                        raise SpreadError(f"the pack was not here by the deadline ({got} of {size} bytes from its parent at "
                                          f"{self.address})") from None
                    raise SpreadError(f"its parent at {self.address} sent nothing for {self.idle_s:.0f} s after {got} of {size} bytes") from None
                except OSError as exc:
                    raise SpreadError(f"its parent at {self.address} went away after {got} of {size} bytes ({exc.strerror or exc})") from None
                if not chunk:
                    raise SpreadError(f"its parent at {self.address} went away after {got} of {size} bytes")
                got += len(chunk)
                yield chunk
        finally:
            self.conn.close()


Consume = Callable[[Iterator[bytes], Callable[[bytes], None]], None]
"""What a node does with the pack: reads every chunk (the second argument, kept for callers that
pass each chunk on, is a no-op: the tree forwards before this node's own use)."""


class OwnUse:
    """This node's own use of the pack (``consume``: unpacking), in a thread of its own behind a
    ``Lane``: given up, never waited for, when it falls ``BEHIND`` or past the deadline."""

    def __init__(self, consume: Consume, room: threading.Condition) -> None:
        self.lane = Lane(room)
        self.error: BaseException | None = None
        self.given_up: str | None = None
        self.thread = threading.Thread(target=self._run, args=(consume,), name="hpctorch-stage-unpack", daemon=True)
        self.thread.start()

    def _run(self, consume: Consume) -> None:
        try:
            consume(self._chunks(), lambda _chunk: None)
        except BaseException as exc:  # noqa: BLE001 - said by finish(), in the node's own line
            self.error = exc

    def _chunks(self) -> Iterator[bytes]:
        try:
            yield from self.lane.drain()
        except OSError:
            raise SpreadError(self.given_up or "its own copy was given up") from None

    def put(self, chunk: bytes, lead: int) -> None:
        """``chunk`` to this node's own use, unless it took ``BEHIND`` bytes less than ``lead``."""
        if self.given_up is not None or self.error is not None:
            return
        if lead - self.lane.taken > BEHIND:
            self.give_up(f"its unpacking fell {BEHIND >> 20} MiB behind the tree (a slow disk or CPU): given up, the pack "
                         "still forwarded")
            return
        self.lane.put(chunk)

    def give_up(self, why: str) -> None:
        if self.given_up is None:
            self.given_up = why
        self.lane.cut()

    def finish(self, deadline: float) -> None:
        """Wait for the unpacking until ``deadline``; raise what stopped it."""
        self.lane.end()
        self.thread.join(max(0.0, deadline - time.monotonic()))
        if self.thread.is_alive():
            self.give_up("its unpacking had not ended by the deadline: given up")
            raise SpreadError(self.given_up)  # type: ignore[arg-type]
        if self.given_up is not None:
            raise SpreadError(self.given_up)
        if self.error is not None:
            raise self.error


def take_part(store, prefix: str, node: int, nnodes: int, host: str, token: str, size: int, consume: Consume,  # type: ignore[no-untyped-def]
              source: Iterable[bytes] | None = None, fanout: int = FANOUT, deadline: float | None = None,
              accept_s: float = 30.0, idle_s: float = IDLE_S, wanted: bool = True) -> None:
    """A node's part in spreading ``size`` bytes: node 0 reads ``source``, every other node its
    parent (found at ``<prefix>addr/<parent>`` in ``store``); each chunk goes to the children
    (who connect within ``accept_s``) and to ``consume``, none waiting for another. The whole part
    ends by ``deadline``. A leaf that has no use for the bytes (not ``wanted``: its copy is
    there) only says so to its parent, which then sends it none."""
    deadline = time.monotonic() + 3600.0 if deadline is None else deadline
    relay = Relay(node, nnodes, host, token, fanout, idle_s)
    own: OwnUse | None = None
    try:
        if relay.children:
            store.set(f"{prefix}addr/{node}", relay.address)
        if source is not None:
            chunks: Iterator[bytes] = iter(source)
        else:
            parent = parent_of(node, fanout)
            address = wait_for(store, f"{prefix}addr/{parent}", deadline, f"node {parent}'s address (its parent in the tree)")
            upstream = Upstream(address, token, node, max(1.0, min(idle_s, deadline - time.monotonic())))
            if not wanted and not relay.children:
                upstream.conn.close()  # taken by the parent at once, then dropped at its first chunk
                return
            chunks = upstream.chunks(size, deadline)
        relay.accept(min(deadline, time.monotonic() + accept_s))
        room = threading.Condition()
        relay.start(room)
        own = OwnUse(consume, room)
        for chunk in chunks:
            # Paced by the fastest child (forwarding comes first), by this node's own use once none is left.
            lead = _paced([lane for lane in relay.lanes.values() if lane.open] or [own.lane], room, deadline)
            relay.cut_behind(lead)
            relay.forward(chunk)
            own.put(chunk, lead)
        relay.finish(deadline)
        own.finish(deadline)
    finally:
        if own is not None and own.thread.is_alive():
            own.give_up("the tree stopped")  # its thread ends at its next chunk
        relay.close()


def _paced(lanes: list[Lane], room: threading.Condition, deadline: float) -> int:
    """Once the fastest open lane holds less than ``AHEAD`` bytes, what it has taken (0 when no
    lane is open: nobody to pace by); SpreadError past ``deadline``."""
    with room:
        while True:
            live = [lane for lane in lanes if lane.open]
            if not live:
                return 0
            fastest = max(live, key=lambda lane: lane.taken)
            if fastest.held < AHEAD:
                return fastest.taken
            left = deadline - time.monotonic()
            if left <= 0:
                raise SpreadError("the pack was not through this node by the deadline")
            room.wait(min(left, 1.0))


def wait_for(store, key: str, deadline: float, what: str) -> str:  # type: ignore[no-untyped-def]
    """``key``'s value once it is set, within ``deadline``; else SpreadError naming ``what``."""
    left = max(1.0, deadline - time.monotonic())
    try:
        store.wait([key], datetime.timedelta(seconds=left))
        return store.get(key).decode()
    except RuntimeError:  # torch's store timeout and lost connection (DistStoreError, DistNetworkError)
        raise SpreadError(f"waited {left:.0f} s for {what}") from None

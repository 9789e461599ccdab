"""The fabric part of the screen: node i measures its link to node i+1 (a ring, never all-to-all).

Bandwidth is bounded in time, not bytes: the sender streams for as long as it can, the receiver
counts what arrived in the first ``BANDWIDTH_S`` after the first byte and answers with that
count at once, whatever is still queued (a 20 Mbit/s link must not stretch the screen). Latency
is the median round trip of one-byte pings on a second connection, for ``LATENCY_S``. Plain TCP on
the address hpctorch chose for this node: the path gloo takes.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
from typing import Any

from ..median import median

BANDWIDTH_S = 1.0
LATENCY_S = 0.25
PINGS_MAX = 500
CHUNK = 1 << 20
_REPLY = struct.Struct("!QQ")  # bytes received in the window, the window in microseconds


class RingListener:
    """This node's end for its predecessor: one bandwidth connection, then one ping connection,
    accepted until ``serve``'s deadline (time.monotonic)."""

    def __init__(self, address: str) -> None:
        self.until = 0.0
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((address, 0))
        self.sock.listen(4)  # a predecessor that comes early waits in the backlog
        self.address = f"{address}:{self.sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def serve(self, until: float) -> None:
        self.until = until
        self._thread.start()

    def wait(self) -> None:
        """Until the predecessor measured this node, or the deadline passed."""
        if self._thread.is_alive():
            self._thread.join(max(0.0, self.until - time.monotonic()) + 0.5)

    def _serve(self) -> None:
        for handle in (_receive_window, _echo):
            try:
                connection = self._accept()
            except OSError:
                return  # closed under it
            if connection is None:
                return
            with connection:
                try:
                    handle(connection, self.until)
                except OSError:
                    pass  # the sender's reset once it has the answer, or the peer gone: its record says so

    def _accept(self) -> socket.socket | None:
        while (left := self.until - time.monotonic()) > 0:
            self.sock.settimeout(min(left, 0.5))
            try:
                connection, _ = self.sock.accept()
            except socket.timeout:
                continue
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return connection
        return None

    def close(self) -> None:
        self.sock.close()


def _receive_window(connection: socket.socket, until: float) -> None:
    buffer = bytearray(CHUNK)
    got, first = 0, None
    while time.monotonic() < until:
        connection.settimeout(max(0.01, until - time.monotonic()))
        count = connection.recv_into(buffer)
        if not count:
            return
        now = time.monotonic()
        if first is None:
            first = now
        elif now - first >= BANDWIDTH_S:
            break
        got += count
    if first is None:
        return
    connection.sendall(_REPLY.pack(got, int((time.monotonic() - first) * 1e6)))
    # Read on (and drop) until the sender, having the answer, closes: closing with its data unread
    # would reset the connection, and a reset can overtake the answer ("Connection reset by peer").
    while time.monotonic() < until:
        connection.settimeout(max(0.01, until - time.monotonic()))
        if not connection.recv_into(buffer):
            return


def _echo(connection: socket.socket, until: float) -> None:
    while time.monotonic() < until:
        connection.settimeout(max(0.01, until - time.monotonic()))
        byte = connection.recv(1)
        if not byte:
            return
        connection.sendall(byte)


def probe(address: str, until: float) -> dict[str, Any]:
    """Bandwidth (MB/s) and latency (microseconds) to the listener at ``host:port``, ended by
    ``until`` whatever the link does; ``error`` instead where it could not be measured."""
    host, port = address.rsplit(":", 1)
    error = f"no answer within the screen's time ({address})"
    try:
        mbs = _bandwidth(host, int(port), until)
    except OSError as exc:
        mbs, error = None, f"{exc.strerror or exc.__class__.__name__} ({address})"
    try:
        # Also after a failed bandwidth: the listener waits for this second connection.
        rtt = _latency(host, int(port), until)
    except OSError:
        rtt = None  # not judged
    if mbs is None:
        return {"error": error}
    return {"mbs": round(mbs, 2), **({"rtt_us": round(rtt, 1)} if rtt is not None else {})}


def _connect(host: str, port: int, until: float) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=max(0.1, min(5.0, until - time.monotonic())))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # Closed with a reset: what is still queued to a slow link is dropped, not drained.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return sock


def _bandwidth(host: str, port: int, until: float) -> float | None:
    payload = memoryview(bytes(CHUNK))
    reply = b""
    with _connect(host, port, until) as sock:
        sock.setblocking(False)
        while len(reply) < _REPLY.size and (left := until - time.monotonic()) > 0:
            readable, writable, _ = select.select([sock], [sock] if not reply else [], [], min(left, 0.5))
            if readable:
                data = sock.recv(_REPLY.size - len(reply))
                if not data:
                    return None
                reply += data
            elif writable:
                try:
                    sock.send(payload)
                except BlockingIOError:
                    pass
    if len(reply) < _REPLY.size:
        return None
    got, micros = _REPLY.unpack(reply)
    return got / max(micros, 1) if micros else None  # bytes per microsecond = MB/s


def _latency(host: str, port: int, until: float) -> float | None:
    rounds: list[float] = []
    end = min(until, time.monotonic() + LATENCY_S)
    with _connect(host, port, until) as sock:
        while time.monotonic() < end and len(rounds) < PINGS_MAX:
            sock.settimeout(max(0.01, until - time.monotonic()))
            begin = time.perf_counter()
            sock.sendall(b"p")
            if not sock.recv(1):
                break
            rounds.append((time.perf_counter() - begin) * 1e6)
    return median(rounds) if rounds else None

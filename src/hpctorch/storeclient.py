"""A client of torch's own TCPStore, in Python, for the processes that must not import torch
before their environment is staged: importing torch from the shared file system to fetch the
environment that spares them importing it from there would undo the point.

It speaks the protocol of torch's TCPStore client (torch/csrc/distributed/c10d/TCPStore.cpp,
TCPStoreBackend.hpp, torch >= 2.4): a connection opens with VALIDATE and its magic number,
then PING with a nonce the server echoes; each request is a query byte, strings and byte
vectors prefixed by their uint64 length, integers little-endian; every key carries the
client's "/" prefix. The server stays torch's (node 0's ``TCPStore``). For an older torch
(``speaks_with``, from the version file ``installed_torch`` reads) and for a server that does
not answer the handshake as this one does (``ProtocolMismatch``), the caller uses torch's own
client.
"""

from __future__ import annotations

import datetime
import os
import socket
import struct
import threading
import time
from collections.abc import Sequence

VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY, APPEND, MULTI_GET, MULTI_SET, CANCEL_WAIT, PING = range(14)
MAGIC = 0x3C85F7CE
STOP_WAITING, WAIT_CANCELED = 0, 1
READY, NOT_READY = 0, 1
KEY_PREFIX = "/"
FIRST_TORCH = (2, 4)
"""The first torch whose TCPStore opens connections with VALIDATE and PING (older ones are reached
through torch's own client)."""


class StoreError(RuntimeError):
    """A request failed or timed out (a RuntimeError, as torch's own store errors are)."""


class StoreLost(StoreError):
    """The connection failed or was closed: the store went away, not a slow answer."""


class ProtocolMismatch(StoreError):
    """The server did not answer as torch >= 2.4's TCPStore does: ``answered`` when it said
    something else or closed the connection (another torch's protocol), not when it said nothing
    in time (a listener that is no store: torch's own client would wait on it without end)."""

    def __init__(self, message: str, answered: bool = True) -> None:
        super().__init__(message)
        self.answered = answered


def _string(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(data)) + data


def _keys(keys: Sequence[str]) -> bytes:
    return struct.pack("<Q", len(keys)) + b"".join(_string(KEY_PREFIX + key) for key in keys)


class StoreClient:
    """set, get, multi_get, add, append, compare_set, check, delete_key and wait on torch's TCPStore at
    ``host``:``port``; one request at a time (a lock), as torch's own client, so threads may share it."""

    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        """Connected and answered within ``timeout_s``: torch's own client waits as long (its
        server can take seconds to answer a burst of new connections)."""
        self.timeout_s = timeout_s
        self.conn = socket.create_connection((host, port), timeout=timeout_s)
        self.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        nonce = (os.getpid() ^ threading.get_ident()) & 0xFFFFFFFF
        try:
            self.conn.sendall(struct.pack("<BI", VALIDATE, MAGIC) + struct.pack("<BI", PING, nonce))
            answer = struct.unpack("<I", self._exactly(4))[0]
        except (StoreLost, ConnectionError) as exc:
            self.close()
            raise ProtocolMismatch(f"the connection closed during the handshake ({exc})") from None
        except (OSError, StoreError) as exc:
            self.close()
            raise ProtocolMismatch(f"no answer to the handshake within {timeout_s:.0f} s ({exc})", answered=False) from None
        if answer != nonce:
            self.close()
            raise ProtocolMismatch(f"the handshake's nonce came back as {answer}, not {nonce}")
        self.conn.settimeout(timeout_s)
        self.lock = threading.RLock()

    def close(self) -> None:
        self.conn.close()

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        """Each later request's limit (torch's ``Store.set_timeout``)."""
        self.timeout_s = timeout.total_seconds()
        self.conn.settimeout(self.timeout_s)

    def __del__(self) -> None:
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001 - interpreter teardown
            pass

    def _exactly(self, count: int, waiting: bool = False) -> bytes:
        """``count`` bytes of the answer. Out of time, the connection is closed (a late answer
        would be read as the next request's), unless ``waiting``: a wait is cancelled instead."""
        data = bytearray()
        while len(data) < count:
            try:
                part = self.conn.recv(count - len(data))
            except (TimeoutError, socket.timeout):
                if not waiting:
                    self.close()
                raise StoreError("the store did not answer in time") from None
            except OSError as exc:
                raise StoreLost(f"the store's connection failed: {exc.strerror or exc}") from None
            if not part:
                raise StoreLost("the store closed the connection")
            data += part
        return bytes(data)

    def _send(self, data: bytes) -> None:
        try:
            self.conn.sendall(data)
        except OSError as exc:
            raise StoreLost(f"the store's connection failed: {exc.strerror or exc}") from None

    def _bytes(self) -> bytes:
        return self._exactly(struct.unpack("<Q", self._exactly(8))[0])

    def set(self, key: str, value: str | bytes) -> None:
        with self.lock:
            self._send(bytes([SET]) + _string(KEY_PREFIX + key) + _string(value))

    def get(self, key: str) -> bytes:
        with self.lock:
            self.wait([key])
            self._send(bytes([GET]) + _string(KEY_PREFIX + key))
            return self._bytes()

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        """Every key's value, once all are set (torch's client waits for them first, too)."""
        with self.lock:
            self.wait(keys)
            self._send(bytes([MULTI_GET]) + _keys(keys))
            return [self._bytes() for _ in keys]

    def add(self, key: str, amount: int) -> int:
        with self.lock:
            self._send(bytes([ADD]) + _string(KEY_PREFIX + key) + struct.pack("<q", amount))
            return struct.unpack("<q", self._exactly(8))[0]

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        with self.lock:
            self._send(bytes([COMPARE_SET]) + _string(KEY_PREFIX + key) + _string(expected) + _string(desired))
            return self._bytes()

    def append(self, key: str, value: str | bytes) -> None:
        with self.lock:
            self._send(bytes([APPEND]) + _string(KEY_PREFIX + key) + _string(value))

    def delete_key(self, key: str) -> bool:
        with self.lock:
            self._send(bytes([DELETE_KEY]) + _string(KEY_PREFIX + key))
            return struct.unpack("<q", self._exactly(8))[0] == 1

    def check(self, keys: Sequence[str]) -> bool:
        """Whether every key is set, without waiting."""
        with self.lock:
            self._send(bytes([CHECK]) + _keys(keys))
            answer = self._exactly(1)[0]
        if answer not in (READY, NOT_READY):
            raise StoreError(f"unexpected answer {answer} to a check")
        return answer == READY

    def wait(self, keys: Sequence[str], timeout: datetime.timedelta | None = None) -> None:
        """Until every key is set; past ``timeout`` (the client's own by default) StoreError, after
        cancelling the wait as torch's client does, so the connection stays usable."""
        limit = self.timeout_s if timeout is None else timeout.total_seconds()
        with self.lock:
            self._send(bytes([WAIT]) + _keys(keys))
            self.conn.settimeout(max(0.001, limit))
            try:
                answer = self._exactly(1, waiting=True)[0]
            except StoreError as exc:
                if "in time" not in str(exc):
                    raise
                self._cancel()
                raise StoreError(f"wait timeout after {limit:.0f} s, keys: {', '.join(keys)}") from None
            finally:
                self.conn.settimeout(self.timeout_s)
        if answer != STOP_WAITING:
            raise StoreError(f"unexpected answer {answer} to a wait")

    def _cancel(self) -> None:
        self._send(bytes([CANCEL_WAIT]))
        answer = self._exactly(1)[0]
        if answer == STOP_WAITING:  # the key came just before the cancel: its answer, then the cancel's
            answer = self._exactly(1)[0]
        if answer != WAIT_CANCELED:
            raise StoreError(f"unexpected answer {answer} to a cancelled wait")


def connect(host: str, port: int, timeout_s: float, pause_s: float = 0.05, pause_max_s: float = 1.0) -> StoreClient:
    """A client once the server answers, retrying refusals with backoff until ``timeout_s``;
    ``ProtocolMismatch`` at once when a server answers another way."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return StoreClient(host, port, max(1.0, deadline - time.monotonic()))
        except ProtocolMismatch:
            raise
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise StoreError(f"could not reach the store at {host}:{port} within {timeout_s:.0f} s ({exc.strerror or exc})") from None
        time.sleep(pause_s)
        pause_s = min(pause_s * 1.5, pause_max_s)


def open_client(host: str, port: int, timeout_s: float):  # type: ignore[no-untyped-def]
    """A client of the TCPStore at ``host``:``port``: this module's where it speaks the installed
    torch's protocol (the process then never imports torch: about 3 s of CPU and 300 MB), else
    torch's own."""
    if speaks_with(installed_torch()):
        try:
            return StoreClient(host, port, timeout_s)
        except ProtocolMismatch as exc:
            if not exc.answered:
                raise  # a listener that says nothing: torch's client would wait on it for ever
            # a server of another protocol: torch's own client speaks it
    from torch.distributed import TCPStore

    return TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)


def speaks_with(torch_version: str | None) -> bool:
    """Whether this client speaks ``torch_version``'s TCPStore protocol."""
    try:
        numbers = tuple(int(part) for part in (torch_version or "").split("+")[0].split(".")[:2])
    except ValueError:
        return False
    return len(numbers) == 2 and numbers >= FIRST_TORCH


def installed_torch() -> str | None:
    """The version of the torch this interpreter would import, read from its version.py without
    importing it (a handful of file-system calls, not thousands)."""
    import importlib.util
    import re

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        try:
            with open(os.path.join(folder, "version.py"), encoding="utf-8") as handle:
                found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", handle.read(), re.M)
        except OSError:
            continue
        if found:
            return found.group(1)
    return None

"""Shared-file exchange of the master's address, for when its host name cannot be trusted.

Node 0 writes ``{"run_id", "addr", "port", "host"}`` atomically (write, then rename) to
``Plan.master_exchange`` in a directory all nodes share; the other nodes poll for it
until the rendezvous timeout. ``discover`` runs it before the final plan is made, and
torch's own TCP rendezvous takes over from there.

At scale this must not bury a parallel file system: only node 0 (local rank 0) writes,
one file; a reader stops at its first good read and polls with exponential backoff and
jitter, from ``POLL_FIRST_S`` up to ``POLL_MAX_S``: at most ~38 reads in its first minute
and 30 a minute after that, whatever the node count. Per task, one reader per node (8 ranks
a node would otherwise make 8 readers a node): local rank 0 reads the shared file and relays
the record to the node's other ranks through a node-local file (in /dev/shm); a rank that
sees no local rank 0 at work there within ``RELAY_GRACE_S`` (a container with a /dev/shm of
its own) reads the shared file itself.
"""

from __future__ import annotations

import json
import os
import random
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from ..errors import HpctorchError
from ..host.folders import sweep
from ..progress import Progress
from .types import Plan

POLL_FIRST_S = 0.1
POLL_MAX_S = 2.0
RELAY_POLL_S = 0.02
RELAY_GRACE_S = 5.0
RELAY_FRESH_S = 10.0
KEPT_S = 86400.0
"""Records of earlier runs (relays, the shared folder's) are removed once this old."""
"""Local rank 0 touches its marker at every poll (at most every ``POLL_MAX_S``): one older than
this means it is gone, and the others read the shared file themselves."""


def write_master(plan: Plan) -> None:
    """Node 0: publish this node's address for the others."""
    assert plan.master_exchange and plan.master_addr
    try:
        _write_record(Path(plan.master_exchange), _record(plan, plan.master_addr))
    except OSError as exc:
        raise HpctorchError(
            f"cannot write the master's address to {plan.master_exchange}: {exc.strerror}",
            "pass --rendezvous-dir with a directory all nodes share and can write, or --master-addr",
        ) from None


def read_master(plan: Plan) -> str:
    """Any other node: wait for node 0's record of this run and return its address."""
    assert plan.master_exchange
    deadline = time.monotonic() + plan.rdzv_timeout
    local = plan.nproc_per_node[plan.node_rank] if plan.node_rank < len(plan.nproc_per_node) else 1
    if plan.mode != "per-task" or local < 2 or not plan.workers:
        return _read_shared(plan, deadline)
    relay = os.path.join(relay_dir(), f"{plan.run_id}.master.json")
    if plan.workers[0].local_rank == 0:
        address = _read_shared(plan, deadline, lambda: _touch(relay + ".reading"))
        try:
            _write_record(Path(relay), _record(plan, address))
            os.remove(relay + ".reading")
            # Relays of earlier jobs (nobody knows when the last local rank read one): gone after a day.
            sweep(os.path.dirname(relay), (".master.json", ".master.json.reading"), KEPT_S)
        except OSError:
            pass  # the node's other ranks read the shared file themselves
        return address
    return _read_relay(plan, relay, deadline) or _read_shared(plan, deadline)


def relay_dir() -> str:
    """Node-local, in memory where it can be (``host.folders.node_dir``): the others poll it.
    Private: a record planted there by another user would name the master."""
    from ..host.folders import node_dir, private_dir

    return private_dir(node_dir())


def _read_shared(plan: Plan, deadline: float, on_poll: Callable[[], None] | None = None) -> str:
    assert plan.master_exchange
    path = Path(plan.master_exchange)
    pause = POLL_FIRST_S
    progress = Progress(plan.rdzv_timeout)
    while True:
        progress.tick(lambda: _waiting(plan))
        if on_poll:
            on_poll()
        record = _read_record(path)
        if _written_by_master(plan, record):
            progress.done()
            _check_writer(path.parent)
            return str(record["addr"])  # type: ignore[index]
        if time.monotonic() > deadline:
            progress.done()
            raise _timed_out(plan)
        # Jitter spreads thousands of readers that started together.
        time.sleep(min(pause * random.uniform(0.75, 1.25), max(0.0, deadline - time.monotonic()) + 0.01))
        pause = min(POLL_MAX_S, pause * 1.5)


def _read_relay(plan: Plan, relay: str, deadline: float) -> str | None:
    """The address local rank 0 relayed; None once no local rank 0 is seen at work."""
    started = time.monotonic()
    progress = Progress(plan.rdzv_timeout)
    try:
        while True:
            progress.tick(lambda: _waiting(plan))
            record = _read_record(Path(relay))
            if _written_by_master(plan, record):
                return str(record["addr"])  # type: ignore[index]
            if time.monotonic() - started > RELAY_GRACE_S and not _fresh(relay + ".reading"):
                return None
            if time.monotonic() > deadline:
                raise _timed_out(plan)
            time.sleep(RELAY_POLL_S)
    finally:
        progress.done()


def _read_record(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _record(plan: Plan, address: str) -> dict[str, object]:
    # The scheduler's name for node 0, which every reader compares with its node list
    # (gethostname() may differ: nid001234 vs nid001234.local, or a container's name).
    host = plan.nodes[0] if plan.nodes else socket.gethostname()
    return {"run_id": plan.run_id, "addr": address, "port": plan.master_port, "host": host}


def _write_record(path: Path, record: Mapping[str, object]) -> None:
    """Atomically (write, then rename): a reader sees the whole record or none. In a folder
    of this user's only (``host.folders.private_dir``)."""
    from ..host.folders import private_dir, replace_file

    private_dir(str(path.parent))
    replace_file(str(path), json.dumps(record))


def _check_writer(folder: Path) -> None:
    """Once, before a record found in the shared folder is believed: that folder is this
    user's and no one else could have written it."""
    from ..host.folders import why_unsafe

    unsafe = why_unsafe(str(folder))
    if unsafe:
        raise HpctorchError(f"the master's address was found in {folder}, which {unsafe}",
                            "remove that folder and pass --rendezvous-dir with a directory of your own that all nodes share")


def _touch(path: str) -> None:
    try:
        with open(path, "a", encoding="utf-8"):
            pass
        os.utime(path)
    except OSError:
        pass  # the node's other ranks then read the shared file themselves



def _fresh(path: str) -> bool:
    try:
        return time.time() - os.stat(path).st_mtime < RELAY_FRESH_S
    except OSError:
        return False


def _master(plan: Plan) -> str:
    return plan.nodes[0] if plan.nodes else "node 0"


def _waiting(plan: Plan) -> str:
    return f"node {plan.node_rank}: waiting for {_master(plan)} to write its address to {plan.master_exchange}"


def _timed_out(plan: Plan) -> HpctorchError:
    path = Path(plan.master_exchange or "")
    master = _master(plan)
    return HpctorchError(
        f"waited {plan.rdzv_timeout} s for {master} to write its address to {path}",
        f"check that {master} started, that {path.parent.parent} is shared by all nodes, or pass --master-addr",
    )


def _written_by_master(plan: Plan, record: object) -> bool:
    """This run's record, written on the node that holds rank 0 now.

    A requeued job keeps its job and step ids, so a file from its previous run has
    the same run id; the address is only right if the writer is today's node 0.
    """
    if not isinstance(record, dict) or record.get("run_id") != plan.run_id or not record.get("addr"):
        return False
    if not plan.nodes:
        return True
    return str(record.get("host", "")).split(".")[0] == plan.nodes[0].split(".")[0]

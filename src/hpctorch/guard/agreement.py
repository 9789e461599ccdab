"""Before any worker starts, every node checks that all nodes planned the same job.

A node that planned another port, master, world size or job would otherwise wait in the
rendezvous until its timeout. Each node publishes a record of what it planned through
two channels and compares every record it sees with its own:

- the master's TCPStore: node 0 creates it now (multi-tenant, so torch's static
  rendezvous reuses it later) and every node that planned the same address and port
  reaches it; the check passes once all nodes' records are there and equal;
- when the nodes share a directory, one beating file per node (``sharedfiles``): how
  nodes that cannot reach the same store still see each other.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import os
import socket
import time
from collections.abc import Mapping

from ..errors import HpctorchError
from ..host import network
from ..host.folders import sweep
from ..plan.types import Plan
from ..progress import Progress
from ..schedulers import hostlist
from ..terminal import printable
from . import authority
from .sharedfiles import BeatingFiles

POLL_S = 0.05
POLL_MAX_S = 0.5
MASTER_POLL_MAX_S = 0.1
CONNECT_TIMEOUT_S = 2.0
"""A refused connection answers at once; an unanswered SYN (node 0 busy accepting thousands
of nodes, a lossy link) needs longer than a poll to be answered."""
"""How often the store is asked; the shared files are written and read at most once a
second (``sharedfiles``), and read only once the store has not settled it quickly."""
FILES_AFTER_S = 2.0
PROBE_S = 3.0
"""How long whatever listens at the master port has to answer as a store and show node 0's
record before the node lets go of it and polls again: a listener that is not node 0's store
(someone's for a moment before node 0 binds, another job's store) costs a probe, not the job
(torch's own client waits on a listener that never answers for ever, whatever its timeout)."""
GRACE_S = 2.5
SHARED_KEPT_S = 86400.0
"""What earlier runs left in the shared folder (master records, agreement and doctor folders)
is removed by node 0 once this old."""
"""A node that found a disagreement keeps beating this long, so the others see it too."""
STORE_PREFIX = "hpctorch/agreement/"
HANDOVER_ENV = "HPCTORCH_PORT_HANDOVER"
"""In node 0's rank 0 under hpctorch's starter: the file by which it asks hpctorch on its node for
the master port that hpctorch serves until then (``start.masterport``)."""
FIELDS = (
    ("job", "job id"),
    ("master", "master address:port"),
    ("nnodes", "number of nodes"),
    ("nproc_per_node", "processes per node"),
    ("world_size", "world size"),
    ("nodes", "node list"),
)


def record(plan: Plan) -> dict[str, object]:
    """What this node planned, in the terms every node must share."""
    return {
        "node": plan.node_rank,
        "host": socket.gethostname(),
        "job": plan.job_id or "",
        "master": f"{plan.master_addr}:{plan.master_port}",
        "nnodes": plan.nnodes,
        "nproc_per_node": _compact(_runs(plan.nproc_per_node)),
        "world_size": plan.world_size,
        "nodes": _compact(_hostlist(plan.nodes)),
    }


RECORD_FIELD_MAX = 200
"""Characters a list may take in a record before it is replaced by its digest: every node
publishes one record and node 0 reads them all, so a record must not grow with N (a plain
node list at 10,000 nodes is ~100 KB per record, 1 GB for node 0 to read)."""


def _compact(text: str) -> str:
    if len(text) <= RECORD_FIELD_MAX:
        return text
    return f"{text[:40]}... (digest {hashlib.sha256(text.encode()).hexdigest()[:16]})"


@functools.lru_cache(maxsize=8)  # 14 ms for 4,096 names; simulated nodes share one list
def _hostlist(nodes: tuple[str, ...]) -> str:
    return hostlist.display(nodes)


@functools.lru_cache(maxsize=8)
def _runs(counts: tuple[int, ...]) -> str:
    """``2x4096``, or ``2x3,1x1`` where the counts differ."""
    runs: list[list[int]] = []
    for count in counts:
        if runs and runs[-1][0] == count:
            runs[-1][1] += 1
        else:
            runs.append([count, 1])
    return ",".join(f"{count}x{times}" for count, times in runs)


def differences(records: Mapping[int, Mapping[str, object]]) -> list[str]:
    """One line per field on which the records differ, naming each node's value."""
    lines = []
    for key, label in FIELDS:
        values = {node: r.get(key) for node, r in sorted(records.items())}
        if len({json.dumps(v) for v in values.values()}) > 1:
            shown = ", ".join(f"node {n} ({records[n].get('host')}) {_show(v)}" for n, v in values.items())
            lines.append(f"{label}: {shown}")
    return lines


def _show(value: object) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value) if value not in ("", None) else "(none)"


def disagreement_error(lines: list[str]) -> HpctorchError:
    return HpctorchError(
        "the nodes planned different jobs: " + printable("; ".join(lines), lines=False),
        "start every node with the same options and environment ('hpctorch plan' on each node "
        "shows where each value came from)",
    )


def open_store(plan: Plan, timeout_s: float, serve: bool | None = None, port: int | None = None):  # type: ignore[no-untyped-def]
    """The master's store: served here on node 0 (or where ``serve`` says), a client elsewhere;
    at the master port, or ``port`` (the watchdog's store, ``nodewatch``)."""
    from torch.distributed import TCPStore

    return TCPStore(
        plan.master_addr, plan.master_port if port is None else port, None, plan.is_master if serve is None else serve,
        datetime.timedelta(seconds=timeout_s), wait_for_workers=False, multi_tenant=True,
    )


def reach(plan: Plan, deadline: float, probe_s: float = PROBE_S):  # type: ignore[no-untyped-def]
    """One try at node 0's store at the master port, from another node: (the store, sealed, with
    requests allowed until ``deadline``, None), or (None, why not) where what listens there does not
    answer as a store, or not as this job's node 0, within ``probe_s`` (None where it closed first:
    node 0's hpctorch handing the port to rank 0). Another user's store there raises (the job
    cannot have that port)."""
    from .. import storeclient

    probe = max(1.0, min(probe_s, deadline - time.monotonic()))
    try:
        client = storeclient.open_client(plan.master_addr or "", plan.master_port, probe)
    except OSError:
        return None, None  # gone again: the next poll
    except Exception as exc:  # noqa: BLE001 - not a store: torch's client and ours raise several kinds
        return None, f"what listens there does not answer as a store ({authority.first_line(exc)})"
    try:
        store = authority.sealed(client, plan, probe, serve=False)
    except authority.AuthError as exc:
        if hasattr(client, "close"):
            client.close()
        if "another user" in exc.cause:
            raise
        return None, None if isinstance(exc, authority.StoreGone) else exc.cause
    store.set_timeout(datetime.timedelta(seconds=max(1.0, deadline - time.monotonic())))
    return store, None


def ask_for_port(serve, timeout_s: float):  # type: ignore[no-untyped-def]
    """In node 0's rank 0: ``serve()`` (which binds the master port), once hpctorch on this node
    let go of it where it holds it (``HANDOVER_ENV``, ``start.masterport``); tried again until
    ``timeout_s``."""
    asked = os.environ.get(HANDOVER_ENV)
    if not asked:
        return serve()
    from ..host.folders import replace_file

    replace_file(asked, str(os.getpid()))
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return serve()
        except Exception:  # noqa: BLE001 - still held by hpctorch for a moment: again
            if time.monotonic() > deadline:
                raise
            time.sleep(POLL_S)


def check(plan: Plan, timeout_s: float):  # type: ignore[no-untyped-def]
    """Wait until every node published the same record; raise on a difference or timeout.

    Node 0 alone reads the records (a list of arrivals, then one multi_get of the new
    ones) and publishes the verdict; every other node makes one store request per poll.
    Returns node 0's store, to be kept open until torch's rendezvous has taken it over.
    """
    mine = record(plan)
    if plan.is_master and plan.agreement_dir:  # once per job, by node 0 alone: earlier runs' leftovers
        sweep(os.path.dirname(plan.agreement_dir), (".master.json", ".agreement", ".doctor"), SHARED_KEPT_S)
    files = BeatingFiles(plan.agreement_dir, plan.node_rank, mine)
    started = time.monotonic()
    deadline = started + timeout_s
    store = None
    if plan.is_master:
        try:
            store = ask_for_port(lambda: open_store(plan, timeout_s), min(30.0, timeout_s))
        except Exception as exc:  # noqa: BLE001 - torch raises several kinds here
            raise HpctorchError(
                f"cannot serve the rendezvous store on port {plan.master_port}{network.holder_line(plan.master_port)}: "
                f"{str(exc).splitlines()[0]}",
                "pass another --master-port, or stop the process that holds it (ss -ltnp)",
            ) from None
        store = authority.sealed(store, plan, timeout_s, serve=True)
        _publish(store, plan.node_rank, mine)
    stored: dict[int, dict] = {plan.node_rank: mine} if plan.is_master else {}
    heard: str | None = None  # why the last listener at the master port was not node 0's store
    probe = PROBE_S  # doubled after each such listener: a server slow under a burst of nodes gets longer
    pause = POLL_S
    progress = Progress(timeout_s)
    try:
        while True:
            progress.tick(lambda: waiting_for(plan, store is not None, stored, heard))
            files.publish()
            # The files matter only when the store does not settle it quickly.
            seen = dict(files.read_live()) if time.monotonic() - started > FILES_AFTER_S else {}
            # A plain connect first: torch's store client logs a C++ trace for every refusal.
            if store is None and network.connect(plan.master_addr, plan.master_port, max(POLL_S, min(CONNECT_TIMEOUT_S, deadline - time.monotonic())))["ok"]:
                store, heard = reach(plan, deadline, probe)
                probe = probe * 2 if heard else probe
                if store is not None:
                    try:
                        _publish(store, plan.node_rank, mine)
                    except Exception:  # noqa: BLE001 - gone again: keep waiting
                        store = None
            if store is not None:
                try:
                    verdict = _judge(store, plan, stored) if plan.is_master else _verdict(store)
                except Exception:  # noqa: BLE001 - node 0 went away: wait for it again
                    verdict, store = None, (store if plan.is_master else None)
                if verdict == "":
                    return store if plan.is_master else None
                if verdict:
                    _acknowledge(store, plan, len(stored))
                    raise disagreement_error(verdict.split("\n"))
            # The store's records are judged by node 0 (the verdict); here only the files' (node 0
            # reads every node's file, the others node 0's alone), and the whole picture only once
            # one differs. Node 0's file carries its verdict to nodes that agree with node 0.
            said = seen.get(0, {}).get("verdict") if not plan.is_master else None
            if said:
                raise disagreement_error(list(said))  # type: ignore[arg-type]
            lines = differences({**seen, **stored, plan.node_rank: mine}) if seen and differences({**seen, plan.node_rank: mine}) else []
            if lines:
                if plan.is_master:
                    files.publish(verdict=lines)
                files.linger(GRACE_S, POLL_S)  # so the others see this node disagree
                raise disagreement_error(lines)
            if time.monotonic() > deadline:
                raise _timeout_error(plan, timeout_s, store is not None, stored, heard)
            time.sleep(pause)
            # Node 0 alone keeps polling fast (its polls read only what is new); the others back off.
            pause = min(pause * 1.5, MASTER_POLL_MAX_S if plan.is_master else POLL_MAX_S)
    finally:
        progress.done()
        files.remove()


def waiting_for(plan: Plan, connected: bool, stored: Mapping[int, object], heard: str | None = None) -> str | None:
    """What this node waits on, from what it already knows (``heard``: why what listens at the
    master port is not node 0's store); None when another node says it."""
    if plan.is_master:
        missing = [n for n in range(plan.nnodes) if n not in stored]
        if not missing:
            return None
        names = hostlist.compress([plan.nodes[n] for n in missing]) if plan.nodes else ", ".join(map(str, missing[:20]))
        return f"waiting for {len(missing):,} of {plan.nnodes:,} nodes ({names})"
    if not connected:
        said = f" ({printable(heard, lines=False)})" if heard else ""
        return f"node {plan.node_rank}: waiting to reach node 0's store at {plan.master_addr}:{plan.master_port}{said}"
    return None


def _publish(store, node: int, mine: Mapping[str, object]) -> None:  # type: ignore[no-untyped-def]
    store.set(f"{STORE_PREFIX}{node}", json.dumps(mine))
    authority.plain(store).append(STORE_PREFIX + "arrived", f"{node},")


def _acknowledge(store, plan: Plan, heard: int) -> None:  # type: ignore[no-untyped-def]
    """A failing verdict: the others say they read it; node 0 serves until they all did
    (its store dies with it), or for ``GRACE_S`` at most."""
    key = STORE_PREFIX + "read"
    try:
        if not plan.is_master:
            store.add(key, 1)
            return
        end = time.monotonic() + GRACE_S
        while store.add(key, 0) < heard - 1 and time.monotonic() < end:
            time.sleep(POLL_S)
    except Exception:  # noqa: BLE001 - best effort: the verdict is already known here
        pass


def _verdict(store) -> str | None:  # type: ignore[no-untyped-def]
    """Node 0's verdict: "" when all agree, the differences one per line, None before."""
    key = STORE_PREFIX + "verdict"
    return store.get(key).decode() if store.check([key]) else None


def _judge(store, plan: Plan, stored: dict[int, dict]) -> str | None:  # type: ignore[no-untyped-def]
    """Node 0: read the records that arrived since last time; once all are in, or one
    differs, publish the verdict for every node."""
    arrived = {int(n) for n in authority.plain(store).get(STORE_PREFIX + "arrived").decode().split(",") if n.isdigit()}
    new = sorted(arrived - set(stored))
    mine = stored[plan.node_rank]
    differs = False
    if new:
        values = store.multi_get([f"{STORE_PREFIX}{n}" for n in new])
        records = {n: json.loads(v) for n, v in zip(new, values)}
        stored.update(records)
        # Only the new records against this node's own: O(new) per poll, not O(N).
        differs = any(differences({plan.node_rank: mine, n: r}) for n, r in records.items())
    lines = differences(stored) if differs else []
    if not lines and len(stored) < plan.nnodes:
        return None
    verdict = "\n".join(lines)
    store.set(STORE_PREFIX + "verdict", verdict)
    return verdict


def _timeout_error(plan: Plan, timeout_s: float, connected: bool, stored: Mapping[int, object],
                   heard: str | None = None) -> HpctorchError:
    where = f"{plan.master_addr}:{plan.master_port}"
    if not connected:
        said = f" (the last answer there: {printable(heard, lines=False)})" if heard else ""
        return HpctorchError(
            f"could not reach the master's store at {where} from {plan.iface or 'this node'} within {timeout_s:.0f} s{said}",
            f"check that node 0 started and is reachable on {plan.iface or 'the chosen interface'} "
            "('hpctorch plan' shows why it was chosen), that every node got the same --master-addr "
            "and --master-port, or raise --rdzv-timeout",
        )
    missing = [n for n in range(plan.nnodes) if n not in stored and n != plan.node_rank]
    if not plan.is_master:
        return HpctorchError(
            f"waited {timeout_s:.0f} s for node 0 to hear from every node at {where}",
            "check that every node started, with the same options, or raise --rdzv-timeout; "
            "the output of node 0 names the missing nodes",
        )
    names = ", ".join(f"{n} ({plan.nodes[n]})" if plan.nodes else str(n) for n in missing)
    return HpctorchError(
        f"waited {timeout_s:.0f} s for node(s) {names} to reach the master's store at {where}",
        "check that every node started, with the same options (a different --master-port or "
        "--master-addr on one node is named here when the nodes share --rendezvous-dir), "
        "or raise --rdzv-timeout",
    )

"""``--screen``: before any worker starts, every node measures itself and its ring link, and
node 0 names the nodes that would hold the job back.

Through the master's store, O(1) per node: one arrival, one address, one wait for the
successor's address, one record, one wait for the verdict, one acknowledgement. Node 0 alone
reads the records (the new ones in one ``multi_get`` per poll) and judges them (``judge``).
The measuring takes a fixed time (``measure``, ``ringlink``), and every wait ends by a deadline
that does not grow with the node count: the screen's budget once every node arrived.
"""

from __future__ import annotations

import datetime
import json
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import HpctorchError
from ..guard import authority
from ..host import network
from ..plan.types import Plan
from ..terminal import printable
from . import judge, measure, ringlink

BUDGET_S = 15.0
"""The most a screen takes once every node arrived, whatever the node count."""
EXIT_BAD_NODES = 3
"""``--screen=fail``'s exit status when nodes were judged bad: neither a usage error (2) nor
a worker's failure (1)."""
RING_SLOT_S = 2.5
"""The ring's part of the screen: a link's second of bandwidth and quarter second of pings, with
room for connecting and answering; the nodes measure themselves once it is over."""
ACK_S = 2.5
VERDICT_AFTER_S = 5.0
"""How long past the budget a node waits for node 0's verdict (node 0 judges once the budget is
up, and N records take it well under a second: benchmark 7)."""
POLL_S = 0.05
POLL_MAX_S = 0.5


@dataclass
class Screened:
    """The outcome, the same on every node; ``records`` (every node's figures) on node 0 only, and
    on the node that becomes node 0 when node 0 sits out as a spare."""

    findings: list[dict[str, Any]]
    unmeasured: list[str]
    seconds: float
    records: dict[int, dict[str, Any]] = field(default_factory=dict)
    after_go_s: float = 0.0
    """Node 0: from the nodes' setting off together to the verdict."""
    spares: list[int] = field(default_factory=list)
    """``--spare-nodes``: the nodes that sit out (the worst first), and the first kept node's
    address, the job's master from now on."""
    master: str | None = None

    @property
    def bad_nodes(self) -> list[int]:
        return sorted({int(f["node"]) for f in self.findings})

    def lines(self, nnodes: int, threshold: float) -> list[str]:
        said = [f"hpctorch: screen: {f['line']}" for f in self.findings]
        if self.unmeasured:
            said.append(f"hpctorch: screen: not measured: {'; '.join(self.unmeasured)}")
        bad = len(self.bad_nodes)
        outcome = f"{bad} of {nnodes} node{'s' if nnodes != 1 else ''} judged bad" if bad else f"no node below {threshold:g}x the median"
        said.append(f"hpctorch: screen: {nnodes} node{'s' if nnodes != 1 else ''} in {self.seconds:.1f} s, {outcome}")
        return said

    def as_dict(self) -> dict[str, Any]:
        return {"findings": self.findings, "unmeasured": self.unmeasured, "seconds": round(self.seconds, 2), "spares": self.spares,
                "figures": {str(n): r for n, r in sorted(self.records.items())}}


def connect(plan: Plan, timeout_s: float, serve: bool | None = None, what: str = "the screen"):  # type: ignore[no-untyped-def]
    """The master's store for ``what`` before the job's own: served by node 0 (or where ``serve``
    says), reached by every other process within ``timeout_s``."""
    from ..guard.agreement import PROBE_S, open_store, reach

    if plan.is_master if serve is None else serve:
        try:
            served = open_store(plan, timeout_s)
        except Exception as exc:  # noqa: BLE001 - torch raises several kinds here
            raise HpctorchError(f"cannot serve the store for {what} on port {plan.master_port}{network.holder_line(plan.master_port)}: "
                                f"{str(exc).splitlines()[0]}",
                                "pass another --master-port, or stop the process that holds it (ss -ltnp)") from None
        return authority.sealed(served, plan, timeout_s, serve=True)
    deadline = time.monotonic() + timeout_s
    pause, probe, heard = POLL_S, PROBE_S, None
    while time.monotonic() < deadline:
        # A plain connect first: a refusal costs no store client (torch's logs a C++ trace for each).
        if network.connect(plan.master_addr or "", plan.master_port, min(2.0, max(0.1, deadline - time.monotonic())))["ok"]:
            reached, heard = reach(plan, deadline, probe)
            if reached is not None:
                return reached
            probe = probe * 2 if heard else probe  # not node 0's store (yet): a probe's cost, then the next poll
        time.sleep(pause)
        pause = min(pause * 1.5, POLL_MAX_S)
    said = f" (the last answer there: {printable(heard, lines=False)})" if heard else ""
    raise HpctorchError(f"could not reach node 0's store at {plan.master_addr}:{plan.master_port} for {what} within {timeout_s:.0f} s{said}",
                        "check that node 0 started and is reachable on the chosen interface ('hpctorch plan' says which), or raise --rdzv-timeout")


def run(plan: Plan, store, threshold: float, use_gpus: bool, prefix: str, wait_s: float,  # type: ignore[no-untyped-def]
        budget_s: float = BUDGET_S, local: Callable[[bool], dict[str, Any]] = measure.this_node, ring: bool = True,
        spares: int = 0, listeners: int = 0) -> Screened:
    """This node's part of the screen, on ``store`` under ``prefix``; the outcome for all.

    ``wait_s`` bounds the wait for the other nodes to arrive (the rendezvous timeout); from the
    last arrival on, everything ends within ``budget_s``. ``local`` measures this node; without
    ``ring`` no link is measured (the benchmark's simulated nodes share one machine). With
    ``spares``, node 0 also chooses that many nodes to sit out, the worst first. ``listeners``:
    the processes beside the nodes' own that read the verdict (``verdict``; per task, a node's
    other ranks), which node 0's store waits for too.
    """
    started = time.monotonic()
    if local is measure.this_node:
        measure.prepare()  # before arriving: the common budget runs from the last arrival
    try:
        record, go = _measure(plan, store, prefix, lambda: local(use_gpus), ring and plan.nnodes > 1, started + wait_s, budget_s, listeners)
        store.set(f"{prefix}record/{plan.node_rank}", json.dumps(record))
        authority.plain(store).append(prefix + "arrived", f"{plan.node_rank},")
        if plan.is_master:
            return _judge(plan, store, prefix, threshold, started, go, go + budget_s, record, spares, listeners)
        return _verdict(plan, store, prefix, started, go + budget_s + VERDICT_AFTER_S)
    except (RuntimeError, ValueError) as exc:  # torch's store errors (DistError is a RuntimeError)
        if plan.is_master:
            raise
        # Node 0 judged and went on without this node's record: its workers' rendezvous decides.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"hpctorch: screen: node {plan.node_rank}: node 0's store went away during the screen ({first[:120]}); going on",
              file=sys.stderr, flush=True)
        return Screened([], [], time.monotonic() - started)


def _measure(plan: Plan, store, prefix: str, local: Callable[[], dict[str, Any]], ring: bool,  # type: ignore[no-untyped-def]
             arrive_by: float, budget_s: float, listeners: int) -> tuple[dict[str, Any], float]:
    """This node's record, and when the nodes set off together (time.monotonic)."""
    me = plan.node_rank
    record: dict[str, Any] = {"node": me, "host": socket.gethostname(), "addr": plan.local_addr}
    listener = ringlink.RingListener(plan.local_addr or "0.0.0.0") if ring else None
    try:
        if listener is not None:
            store.set(f"{prefix}addr/{me}", listener.address)
        store.add(prefix + "here", 1)
        _start_together(plan, store, prefix, arrive_by, listeners)
        # From here every node runs on the same clock: the measures, then collecting and judging.
        go = time.monotonic()
        until = go + budget_s * 0.6
        if listener is not None:
            listener.serve(until)
            record["fabric"] = _probe_successor(plan, store, prefix, until)
            listener.wait()  # the predecessor's measure of this node's link: not disturbed by the others
            record["fabric_s"] = round(time.monotonic() - go, 2)
            # Every node then measures itself at the same moment, none while others still send:
            # on nodes sharing anything (a switch, a chassis' power, a test machine's cores) each
            # node's figure is then taken under the same conditions as the others'.
            time.sleep(max(0.0, min(go + RING_SLOT_S, until) - time.monotonic()))
    finally:
        if listener is not None:
            listener.close()
    record.update(local())
    record["took_s"] = round(time.monotonic() - go, 2)
    return record, go


def _start_together(plan: Plan, store, prefix: str, until: float, listeners: int) -> None:  # type: ignore[no-untyped-def]
    """Node 0 says go once every node and every listener arrived (or the rendezvous timeout
    passed): a listener that came after the verdict would find node 0's store gone. The others
    wait for that word, one blocking request each."""
    if plan.is_master:
        pause = POLL_S
        while (store.add(prefix + "here", 0) < plan.nnodes or (listeners and store.add(prefix + "listening", 0) < listeners)) \
                and time.monotonic() < until:
            time.sleep(pause)
            pause = min(pause * 1.5, POLL_MAX_S)
        store.set(prefix + "go", "1")
        return
    try:
        store.wait([prefix + "go"], datetime.timedelta(seconds=max(1.0, until - time.monotonic())))
    except Exception:  # noqa: BLE001 - torch's timeout: node 0 judges without this node's peers
        pass


def _probe_successor(plan: Plan, store, prefix: str, until: float) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    successor = (plan.node_rank + 1) % plan.nnodes
    key = f"{prefix}addr/{successor}"
    try:
        store.wait([key], datetime.timedelta(seconds=max(0.1, until - time.monotonic())))
    except Exception:  # noqa: BLE001 - torch's timeout: the successor never arrived
        return {"to": successor, "error": "never published its address"}
    return {"to": successor, **ringlink.probe(store.get(key).decode(), until)}


def _judge(plan: Plan, store, prefix: str, threshold: float, started: float, go: float, until: float,  # type: ignore[no-untyped-def]
           mine: dict[str, Any], spares: int, listeners: int) -> Screened:
    records: dict[int, dict[str, Any]] = {plan.node_rank: mine}
    pause = POLL_S
    while len(records) < plan.nnodes and time.monotonic() < until:
        arrived = {int(n) for n in authority.plain(store).get(prefix + "arrived").decode().split(",") if n.isdigit()}
        new = sorted(arrived - set(records))
        if new:
            values = store.multi_get([f"{prefix}record/{n}" for n in new])
            records.update({n: json.loads(v) for n, v in zip(new, values)})
            continue
        time.sleep(pause)
        pause = min(pause * 1.5, POLL_MAX_S)
    found = judge.judge(records, plan.nnodes, threshold, plan.nodes)
    findings = [f.as_dict() for f in found]
    outcome = Screened(findings, judge.unmeasured(records), time.monotonic() - started, records, time.monotonic() - go)
    if spares:
        order = judge.ranking(records, found, plan.nnodes)
        outcome.spares = order[:spares]
        first = min(n for n in order[spares:])
        outcome.master = (records.get(first) or {}).get("addr") or (plan.nodes[first] if first < len(plan.nodes) else None)
    heir = first if spares and plan.node_rank in outcome.spares else None
    if heir is not None:  # node 0 sits out: the new node 0's summary gets the figures, read once by it alone
        store.set(prefix + "figures", json.dumps(records))
    store.set(prefix + "verdict", json.dumps({"findings": findings, "unmeasured": outcome.unmeasured, "seconds": outcome.seconds,
                                              "spares": outcome.spares, "master": outcome.master, "heir": heir}))
    end = time.monotonic() + ACK_S  # node 0's store must outlive the others' reading of the verdict
    while store.add(prefix + "read", 0) < len(records) - 1 + listeners and time.monotonic() < end:
        time.sleep(POLL_S)
    return outcome


def verdict(plan: Plan, store, prefix: str, wait_s: float) -> Screened:  # type: ignore[no-untyped-def]
    """Node 0's verdict for a process that does not screen (per task, a node's other ranks)."""
    started = time.monotonic()
    try:
        store.add(prefix + "listening", 1)
    except (RuntimeError, ValueError):
        pass  # node 0's store is gone already: said below
    return _verdict(plan, store, prefix, started, started + wait_s)


def _verdict(plan: Plan, store, prefix: str, started: float, until: float) -> Screened:  # type: ignore[no-untyped-def]
    wait_s = max(1.0, until - time.monotonic())
    try:
        store.wait([prefix + "verdict"], datetime.timedelta(seconds=wait_s))
        said = json.loads(store.get(prefix + "verdict"))
        records = ({int(n): r for n, r in json.loads(store.get(prefix + "figures")).items()}
                   if said.get("heir") == plan.node_rank else {})
        store.add(prefix + "read", 1)
    except Exception:  # noqa: BLE001 - node 0 gone or late: this node goes on, it cannot judge alone
        print(f"hpctorch: screen: node {plan.node_rank}: no verdict from node 0 within {wait_s:.0f} s; going on", file=sys.stderr, flush=True)
        return Screened([], [], time.monotonic() - started)
    return Screened(said["findings"], said["unmeasured"], float(said["seconds"]), records, spares=said.get("spares", []), master=said.get("master"))


def report(plan: Plan, outcome: Screened, threshold: float, action: str, env: Mapping[str, str], speaks: bool = True) -> None:
    """Node 0 (its one process that ``speaks``) says the findings and puts the bad nodes on the
    user's list; with ``fail`` and a bad node that is not a spare, every process stops here
    (EXIT_BAD_NODES)."""
    speaks = speaks and plan.is_master
    if speaks:
        print(printable("\n".join(outcome.lines(plan.nnodes, threshold))), file=sys.stderr, flush=True)
        if outcome.bad_nodes and plan.nnodes > 1:
            from ..host import badnodes

            for node in outcome.bad_nodes:
                mine = [f for f in outcome.findings if f["node"] == node]
                reason = "; ".join(f["line"] for f in mine)
                name = plan.nodes[node] if node < len(plan.nodes) else host_of(outcome, node)
                rule = f" (named below {threshold:g}x the median of its kind)" if any(f.get("median") is not None for f in mine) else ""
                evidence = {"by": "screen", "threshold": threshold, "findings": mine}
                try:
                    badnodes.add(env, [name], f"screen: {reason}"[:300 - len(rule)] + rule, plan.job_id, evidence)
                except (OSError, HpctorchError) as exc:
                    print(f"hpctorch: screen: could not add {name} to the bad-node list: {exc}", file=sys.stderr, flush=True)
    kept_bad = [n for n in outcome.bad_nodes if n not in outcome.spares]
    if action == "fail" and kept_bad:
        if not speaks:
            raise HpctorchError("", exit_code=EXIT_BAD_NODES)  # node 0 says it, once for the job
        named = ", ".join(host_of(outcome, n) for n in kept_bad)
        raise HpctorchError(f"the screen judged {len(kept_bad)} node(s) bad ({named}); no worker was started",
                            "leave them out (hpctorch submit excludes the bad-node list; --spare-nodes runs on the best), "
                            "or go on with --screen=warn", exit_code=EXIT_BAD_NODES)


def host_of(outcome: Screened, node: int) -> str:
    """The name node 0's findings give ``node`` (its host name), else its number."""
    return next((str(f["host"]) for f in outcome.findings if f["node"] == node), f"node {node}")

"""``hpctorch doctor``'s judgement: every node's report in, a table and verdicts out. Pure.

A report is the JSON-ready dict one node's doctor gathered (see ``doctor.local_report``);
verdicts compare reports across nodes, so they are decided where all reports meet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..guard.agreement import differences
from ..screen.judge import medians, rate

Report = Mapping[str, object]


@dataclass(frozen=True)
class Verdict:
    severity: str  # "fail" or "warn"
    text: str
    fix: str

    def line(self) -> str:
        return f"{self.severity.upper():<4} {self.text}; fix: {self.fix}"


def _who(report: Report) -> str:
    return f"node {report['node']} ({report.get('host', '?')})"


def _iface_of(report: Report, address: str) -> str | None:
    for interface in report.get("interfaces", ()):  # type: ignore[union-attr]
        if any(a.split("/")[0] == address for a in interface["addresses"]):
            return str(interface["name"])
    return None


def verdicts(reports: Mapping[int, Report], nnodes: int, hosts: Sequence[str] = ()) -> list[Verdict]:
    """Every problem found, failures first."""
    found: list[Verdict] = []
    master = reports.get(0)
    for node in range(nnodes):
        if node not in reports:
            host = f" ({hosts[node]})" if node < len(hosts) else ""
            found.append(Verdict("fail", f"node {node}{host} never reported: not started, or it reaches neither "
                                 "node 0's store nor the shared directory",
                                 "check that the job started a doctor on every node; run it there alone to see its report"))
    for report in (reports[n] for n in sorted(reports)):
        found.extend(_node_verdicts(report, master, reports))
    agreed = {n: r["agreement"] for n, r in reports.items() if r.get("agreement")}
    lines = differences(agreed)  # type: ignore[arg-type]
    if lines:
        found.append(Verdict("fail", "the nodes planned different jobs: " + "; ".join(lines),
                             "start every node with the same options and environment ('hpctorch plan --explain' on each node shows where each value came from)"))
    found.extend(_version_skew(reports))
    found.extend(_collective_verdicts(reports))
    found.extend(Verdict("fail", f"screen: {f['line']}", "leave the node out (hpctorch badnodes add NODE; hpctorch submit excludes "
                         "the list) and tell the site's admins what was measured")
                 for f in ((master or {}).get("screen") or {}).get("findings", []))  # type: ignore[union-attr]
    return sorted(found, key=lambda v: v.severity != "fail")


def _node_verdicts(report: Report, master: Report | None, reports: Mapping[int, Report]) -> list[Verdict]:
    found: list[Verdict] = []
    who = _who(report)
    if report.get("plan_error"):
        return [Verdict("fail", f"{who} cannot plan the job: {report['plan_error']}", "see the fix above, on that node")]
    iface = report.get("iface")
    for interface in report.get("interfaces", ()):  # type: ignore[union-attr]
        if master and interface["name"] == master.get("iface") and not interface["up"]:
            found.append(Verdict("fail", f"{who}: {interface['name']}, the interface node 0 talks on, is down",
                                 f"bring the link up (ip link set {interface['name']} up) or leave this node out of the job"))
    on_loopback = str(report.get("address") or "").startswith("127.")  # one host: names do not matter
    for address in () if on_loopback else report.get("resolves", ()):  # type: ignore[union-attr]
        if address.startswith("127."):
            found.append(Verdict("warn", f"{who}: its host name resolves to {address} (loopback): torch's default "
                                 "(the name, or getfqdn) would advertise an address no peer can reach",
                                 "map the host name to its fabric address in /etc/hosts; hpctorch advertises "
                                 f"{report.get('address')} instead"))
        elif iface and _iface_of(report, address) not in (None, iface):
            found.append(Verdict("warn", f"{who}: its host name resolves to {address} on {_iface_of(report, address)}, "
                                 f"not on {iface} where the job talks: tools that use the name "
                                 "(--master-addr $(hostname)) take the other network",
                                 f"pass addresses, not names, or let hpctorch choose ({iface}, {report.get('address')})"))
    if report.get("serve_error") == "in use":
        holder = f", held by {report['port_holder']}" if report.get("port_holder") else ""
        found.append(Verdict("fail", f"{who}: master port {report['master']['port']} is already in use{holder}",  # type: ignore[index]
                             "pass another --master-port, or stop the process that holds it (ss -ltnp)"))
    elif report.get("serve_error"):
        found.append(Verdict("fail", f"{who}: cannot serve the rendezvous store on port {report['master']['port']}: "  # type: ignore[index]
                             f"{report['serve_error']}", "pass another --master-port; see the other verdicts"))
    if report.get("store_auth_error"):
        found.append(Verdict("fail", f"{who}: node 0's port answers, and does not authenticate: {report['store_auth_error']}",
                             "if another user shares these nodes, ask them to stop; hpctorch starts the job on its next port "
                             "(or pass another --master-port)"))
    found.extend(_container_verdicts(report))
    reach = report.get("reach") or {}
    to_master = reach.get("master")  # type: ignore[union-attr]
    if to_master and not to_master["ok"] and not (master and master.get("serve_error")):
        found.append(_master_unreachable(report, master, to_master))
    for peer, probes in sorted((reach.get("peers") or {}).items()):  # type: ignore[union-attr]
        chosen = [p for p in probes if p["chosen"]]
        if chosen and not chosen[0]["ok"]:
            other = reports.get(int(peer))
            whom = _who(other) if other else f"node {peer}"
            working = [p for p in probes if p["ok"]]
            fix = (f"use --iface {working[0]['iface']} (node {peer} answers at {working[0]['addr']} there)"
                   if working else "check the cabling, link state and firewall between them")
            found.append(Verdict("fail", f"{who} cannot reach {whom} at {chosen[0]['addr']} on "
                                 f"{chosen[0]['iface'] or '?'}: {chosen[0]['error']}", fix))
    return found


def _container_verdicts(report: Report) -> list[Verdict]:
    """What commonly breaks inside containers: a shared directory or devices not bound in."""
    found = []
    who, runtime = _who(report), report.get("container")
    inside = f" inside the {runtime} container" if runtime else ""
    shared = report.get("shared_dir") or {}
    if shared and not shared.get("visible"):  # type: ignore[union-attr]
        found.append(Verdict("fail", f"{who}: the shared directory {shared['path']} is not there{inside}",  # type: ignore[index]
                             f"bind it into the container at the same path (e.g. apptainer exec -B {shared['path']}, "  # type: ignore[index]
                             "srun --container-mounts), or pass --rendezvous-dir with a directory every node sees"))
    elif shared and not shared.get("writable"):  # type: ignore[union-attr]
        found.append(Verdict("warn", f"{who}: the shared directory {shared['path']} is read-only{inside}",  # type: ignore[index]
                             "bind it writable, or pass --rendezvous-dir with a writable shared directory"))
    infiniband = report.get("infiniband") or {}
    if infiniband.get("interfaces") and not infiniband.get("devices"):  # type: ignore[union-attr]
        found.append(Verdict("warn", f"{who}: InfiniBand interfaces ({', '.join(infiniband['interfaces'])}) but no "  # type: ignore[index]
                             f"/dev/infiniband{inside}: NCCL falls back to TCP sockets",
                             "bind /dev/infiniband into the container (apptainer --nv does not; add -B /dev/infiniband)"))
    return found


def _master_unreachable(report: Report, master: Report | None, probe: Mapping[str, object]) -> Verdict:
    who, target = _who(report), str(probe["target"])
    address = str(probe.get("address") or target.rsplit(":", 1)[0])
    text = f"{who} cannot reach the master at {target}: {probe['error']}"
    if master is None:
        return Verdict("fail", text, "check that node 0 started; this node's report is all there is")
    same_host = (report.get("reach") or {}).get("master_host")  # type: ignore[union-attr]
    if same_host and same_host.get("ok"):
        return Verdict("fail", f"{text}, yet {address} answers on another port: a firewall drops the master port",
                       f"open port {target.rsplit(':', 1)[1]} between the nodes, or pass a --master-port the firewall allows")
    owner = _iface_of(master, address)
    peer_probes = ((report.get("reach") or {}).get("peers") or {}).get("0", ())  # type: ignore[union-attr]
    working = [p for p in peer_probes if p["ok"]]
    if working:
        alt = working[0]
        where = f" ({owner} on node 0)" if owner else ""
        return Verdict("fail", f"{text}; {address}{where} is not a network this node reaches, but node 0 answers at "
                       f"{alt['addr']} on {alt['iface']}",
                       f"use --iface {alt['iface']} and drop --master-addr (or give --master-addr {alt['addr']})")
    return Verdict("fail", text, "check that node 0 is up and reachable from this node (link state, routes, firewall)")


def _version_skew(reports: Mapping[int, Report]) -> list[Verdict]:
    found = []
    for package in ("torch", "python", "hpctorch", "cuda", "nccl"):
        values = {n: (r.get("versions") or {}).get(package) for n, r in reports.items() if r.get("versions")}  # type: ignore[union-attr]
        if len(set(values.values())) > 1:
            shown = ", ".join(f"node {n} {v or '(none)'}" for n, v in sorted(values.items()))
            found.append(Verdict("fail", f"version skew in {package}: {shown}",
                                 "use one environment (module, venv or container) on every node"))
    return found


def _collective_verdicts(reports: Mapping[int, Report]) -> list[Verdict]:
    found = []
    gloo = [r.get("gloo") for r in reports.values()]
    gloo_failed = [(n, r["gloo"]) for n, r in sorted(reports.items()) if r.get("gloo") and not r["gloo"].get("ok")]  # type: ignore[union-attr]
    for node, result in gloo_failed:
        found.append(Verdict("fail", f"node {node}: gloo all_reduce failed: {result.get('error')}",  # type: ignore[union-attr]
                             "see the reachability verdicts; GLOO_SOCKET_IFNAME must name an interface that reaches every node"))
    gloo_ok = bool(gloo) and all(g and g.get("ok") for g in gloo)  # type: ignore[union-attr]
    for node, report in sorted(reports.items()):
        nccl = report.get("nccl")
        if nccl and not nccl.get("ok"):  # type: ignore[union-attr]
            cause = ("gloo passed on the same nodes, so TCP between them works: likely NCCL_SOCKET_IFNAME, "
                     "NCCL_IB_HCA/NCCL_NET settings, or the fabric plugin (NCCL_DEBUG=INFO shows which)")
            found.append(Verdict("fail", f"node {node}: NCCL failed{' where gloo passed' if gloo_ok else ''}: "
                                 f"{nccl.get('error')}", cause if gloo_ok else "fix the gloo failure first"))  # type: ignore[union-attr]
    return found


def _ms(value: object) -> str:
    return f"{float(value):.1f} ms" if value is not None else ""  # type: ignore[arg-type]


def _screen_lines(first: Report) -> list[str]:
    """The screen's medians, and each node's figures below them (the findings are verdicts)."""
    outcome = first.get("screen")
    if not outcome:
        return [f"screen: not run ({first.get('screen_skipped') or first.get('gloo_skipped') or 'no report'})"]
    records = {int(n): r for n, r in outcome["figures"].items()}  # type: ignore[index, union-attr]
    said = [f"screen: {len(records)} node(s) in {outcome['seconds']:.1f} s; medians: {medians(records) or '-'}"]  # type: ignore[index]
    if outcome.get("unmeasured"):  # type: ignore[union-attr]
        said.append(f"  not measured: {'; '.join(outcome['unmeasured'])}")  # type: ignore[index]
    for node, record in sorted(records.items()):
        fabric = record.get("fabric", {})
        link = (rate(fabric["mbs"]) if "mbs" in fabric else fabric.get("error", "-")) if fabric else "-"
        figures = record.get("figures", {})
        said.append(f"  {record.get('host')}: compute {rate(figures.get('compute_gflops', 0), 'FLOP/s', 'G')}, "
                    f"memory {rate(figures.get('memory_gbs', 0), 'B/s', 'G')}, fabric to node {fabric.get('to', '-')} {link}")
    return said


def table(reports: Mapping[int, Report], nnodes: int, found: Sequence[Verdict]) -> str:
    """The whole report as plain text: one row per node, collectives, details, verdicts."""
    lines = []
    first = reports.get(0) or next(iter(reports.values()), {})
    master = first.get("master") or {}
    lines.append(f"hpctorch doctor: {nnodes} node(s), master {master.get('addr')}:{master.get('port')}")  # type: ignore[union-attr]
    header = ("node", "host", "iface", "address", "name resolves to", "master", "peers", "torch", "python", "gpus")
    rows = [header]
    for node in range(nnodes):
        report = reports.get(node)
        if report is None:
            rows.append((str(node), "(no report)", "", "", "", "", "", "", "", ""))
            continue
        reach = report.get("reach") or {}
        to_master = reach.get("master")  # type: ignore[union-attr]
        peers = reach.get("peers") or {}  # type: ignore[union-attr]
        chosen = [p for probes in peers.values() for p in probes if p["chosen"]]
        rows.append((
            str(node), str(report.get("host")) + (f" [{report['container']}]" if report.get("container") else ""),
            str(report.get("iface") or "-"), str(report.get("address") or "-"),
            ",".join(report.get("resolves") or ()) or "-",  # type: ignore[arg-type]
            ("ok " + _ms(to_master["ms"]) if to_master["ok"] else str(to_master["error"])) if to_master else "-",
            ("ok " + _ms(max(p["ms"] for p in chosen)) if all(p["ok"] for p in chosen) else
             f"{sum(not p['ok'] for p in chosen)} unreachable") if chosen else "-",
            str((report.get("versions") or {}).get("torch")), str((report.get("versions") or {}).get("python")),  # type: ignore[union-attr]
            str((report.get("gpus") or {}).get("count", 0)),  # type: ignore[union-attr]
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines.extend("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)
    for backend in ("gloo", "nccl"):
        result = first.get(backend)
        if not result:
            lines.append(f"{backend}: not run ({first.get(backend + '_skipped') or 'no report'})")
            continue
        if not result.get("ok"):  # type: ignore[union-attr]
            lines.append(f"{backend}: FAILED: {result.get('error')}")  # type: ignore[union-attr]
            continue
        lines.append(f"{backend}: init {result['init_s']:.2f} s, all_reduce sum correct on {result['world']} processes")  # type: ignore[index]
    lines.extend(_screen_lines(first))
    lines.append("interfaces (* = chosen):")
    for node, report in sorted(reports.items()):
        shown = "; ".join(
            f"{i['name']}{'*' if i['name'] == report.get('iface') else ''} {','.join(i['addresses']) or '-'}{'' if i['up'] else ' DOWN'}"
            for i in report.get("interfaces", ())  # type: ignore[union-attr]
        )
        lines.append(f"  {_who(report)}: {shown}")
        if report.get("iface_reason"):
            lines.append(f"    chosen because: {report['iface_reason']}")
    lines.append("environment:")
    for node, report in sorted(reports.items()):
        env = report.get("env") or {}
        lines.append(f"  {_who(report)}: " + (" ".join(f"{k}={v}" for k, v in sorted(env.items())) or "(none of NCCL_*, GLOO_*, MASTER_*)"))  # type: ignore[union-attr]
    lines.append("verdicts:")
    lines.extend(f"  {v.line()}" for v in found)
    if not any(v.severity == "fail" for v in found):
        lines.append("  ok: every check passed")
    return "\n".join(lines)

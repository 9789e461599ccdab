"""Node 0's judgement of the screen's records: every measure against the job's median.

Pure: records in, findings out. A node is named when a figure falls below ``threshold`` times
the median of its kind's figures (above median / threshold for a latency), or when it reports a
problem of its own (a full /tmp, a GPU NVML complains of, fewer active InfiniBand ports than the
median node). The fabric figure of a node is the better of its two ring links (to its successor,
from its predecessor): a slow link slows both its ends, so only a node whose both links are slow
is the slow one.

Like with like: each record says its kinds (``measure.kinds``: the CPU model and threads, the
memory size, the GPU model), and a measure of the CPU, the memory or the GPUs is compared only
among nodes of the same kind: in a mixed allocation the minority is another machine, not a slow
one. A node alone of its kind has nothing to be compared with, and is said so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ..median import median as median_of

DEFAULT_THRESHOLD = 0.5
LATENCY_FLOOR_US = 500.0
"""A latency is named only when it also exceeds the median by this much: a few hundred
microseconds of jitter on a busy node slow no training step."""


@dataclass(frozen=True)
class Finding:
    node: int
    host: str
    measure: str
    detail: str
    shortfall: float
    """How far below the median (0: a problem judged on its own, 1: missing); orders spares."""
    value: float | None = None
    median: float | None = None
    """A figure's finding: the node's figure, its kind's median (in the measure's units, ``key``)."""
    key: str = ""
    kind: str = ""

    def line(self) -> str:
        return f"{self.host}: {self.measure} {self.detail}"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "line": self.line()}


def rate(value: float, unit: str = "B/s", base: str = "M") -> str:
    """``2.4 MB/s``, ``1.1 GB/s``: three significant figures in the largest unit that fits."""
    scale = {"M": 1e6, "G": 1e9}[base]
    amount = value * scale
    for prefix, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if amount >= size:
            return f"{amount / size:.3g} {prefix}{unit}"
    return f"{amount:.3g} {unit}"


def _figure(records: Mapping[int, Mapping[str, Any]], node: int, key: str) -> float | None:
    value = records[node].get("figures", {}).get(key)
    return float(value) if isinstance(value, (int, float)) else None


def _gpu_min(records: Mapping[int, Mapping[str, Any]], node: int, key: str) -> float | None:
    values = [g[key] for g in records[node].get("figures", {}).get("gpus", []) if isinstance(g.get(key), (int, float))]
    return min(values) if values else None


def incoming(records: Mapping[int, Mapping[str, Any]]) -> dict[int, int]:
    """Each node's predecessor in the ring, by the link the predecessor measured to it."""
    return {record["fabric"]["to"]: node for node, record in records.items() if isinstance(record.get("fabric", {}).get("to"), int)}


def _fabric(records: Mapping[int, Mapping[str, Any]], node: int, key: str, best: Callable, into: Mapping[int, int]) -> tuple[float, str] | None:
    """The better of the node's two ring links for ``key`` (mbs, rtt_us), and how to say it."""
    links = []
    out = records[node].get("fabric", {})
    if key in out:
        links.append((out[key], f"to {_host(records, out.get('to'))}"))
    other = into.get(node)
    link = records[other].get("fabric", {}) if other is not None and other != node else {}
    if key in link:
        links.append((link[key], f"from {_host(records, other)}"))
    if not links:
        return None
    value = best(v for v, _ in links)
    return value, ", ".join(f"{_say(key, v)} {where}" for v, where in links)


def _host(records: Mapping[int, Mapping[str, Any]], node: object) -> str:
    record = records.get(node) if isinstance(node, int) else None
    return str(record.get("host", f"node {node}")) if record else f"node {node}"


def _say(key: str, value: float) -> str:
    if key == "mbs":
        return rate(value)
    if key == "rtt_us":
        return f"{value / 1000:.3g} ms round trip" if value >= 1000 else f"{value:.3g} us round trip"
    if key == "compute_gflops":
        return rate(value, "FLOP/s", "G")
    if key == "tflops":
        return rate(value * 1000, "FLOP/s", "G")
    return rate(value, "B/s", "G")


# (measure named in the line, how a node's figure is read, key for units, lower is better, the
# kind of node it is compared within: "" for the fabric, whose figures are links, not machines)
MEASURES: tuple[tuple[str, Callable[..., Any], str, bool, str], ...] = (
    ("compute", lambda r, n, _i: _figure(r, n, "compute_gflops"), "compute_gflops", False, "cpu"),
    ("memory", lambda r, n, _i: _figure(r, n, "memory_gbs"), "memory_gbs", False, "memory"),
    ("GPU compute", lambda r, n, _i: _gpu_min(r, n, "tflops"), "tflops", False, "gpu"),
    ("host to GPU", lambda r, n, _i: _gpu_min(r, n, "h2d_gbs"), "h2d_gbs", False, "gpu"),
    ("GPU to host", lambda r, n, _i: _gpu_min(r, n, "d2h_gbs"), "d2h_gbs", False, "gpu"),
    ("fabric", lambda r, n, i: _fabric(r, n, "mbs", max, i), "mbs", False, ""),
    ("fabric latency", lambda r, n, i: _fabric(r, n, "rtt_us", min, i), "rtt_us", True, ""),
)


def kind_of(records: Mapping[int, Mapping[str, Any]], node: int, kind: str) -> str:
    """The node's kind for a measure ("" where the record says none: compared with all alike)."""
    kinds = records[node].get("kinds")
    return str(kinds.get(kind) or "") if kind and isinstance(kinds, dict) else ""


def by_kind(records: Mapping[int, Mapping[str, Any]], figures: Mapping[int, tuple[float, str | None]],
            kind: str) -> dict[str, dict[int, tuple[float, str | None]]]:
    """The figures of one measure, grouped by the nodes' kind for it."""
    groups: dict[str, dict[int, tuple[float, str | None]]] = {}
    for node, figure in figures.items():
        groups.setdefault(kind_of(records, node, kind), {})[node] = figure
    return groups


def judge(records: Mapping[int, Mapping[str, Any]], nnodes: int, threshold: float = DEFAULT_THRESHOLD,
          names: tuple[str, ...] = ()) -> list[Finding]:
    """Every finding, ordered by node: missing records, problems, figures off the median."""
    found: list[Finding] = []
    for node in range(nnodes):
        if node not in records:
            host = names[node] if node < len(names) else f"node {node}"
            found.append(Finding(node, host, "screen", "sent no record within the screen's time", 1.0))
    for node, record in sorted(records.items()):
        host = str(record.get("host", f"node {node}"))
        found += [Finding(node, host, "health", problem, 0.0) for problem in record.get("problems", [])]
    found += _refused_links(records)
    if len({r.get("host") for r in records.values()}) < 2:
        return sorted(found, key=lambda f: f.node)  # processes sharing one machine (simulated nodes): no speed to compare
    into = incoming(records)
    for measure, read, key, lower_better, kind in MEASURES:
        groups = by_kind(records, _figures(records, read, into), kind)
        for name, figures in groups.items():
            if len(figures) < 2:
                continue  # alone of its kind: nothing to compare with (``unmeasured`` says so)
            median = median_of(value for value, _ in figures.values())
            among = f" of the {len(figures)} nodes with {name}" if len(groups) > 1 else ""
            for node, (value, words) in sorted(figures.items()):
                if lower_better:
                    bad = value > median / threshold and value - median > LATENCY_FLOOR_US
                    shortfall = 1 - median / value if value else 0.0
                else:
                    bad = value < threshold * median
                    shortfall = 1 - value / median if median else 0.0
                if bad:
                    found.append(Finding(node, _host(records, node), measure,
                                         f"{words or _say(key, value)} (median {_say(key, median)}{among})", round(shortfall, 3),
                                         value, median, key, name))
    found += _infiniband(records)
    return sorted(found, key=lambda f: f.node)


def _refused_links(records: Mapping[int, Mapping[str, Any]]) -> list[Finding]:
    """Ring probes that failed, each blamed as the figures are: on the node whose both links fail
    (the probe into it and its own probe out), else on the prober (its end, or the link)."""
    failed = {n: r["fabric"] for n, r in records.items() if "error" in r.get("fabric", {}) and r["fabric"].get("to") in records}
    found: dict[int, Finding] = {}
    for prober, link in sorted(failed.items()):
        target = link["to"]
        if target in failed and target != prober:  # the target's own probe failed too: both its links
            found.setdefault(target, Finding(target, _host(records, target), "fabric",
                                             f"from {_host(records, prober)} and to {_host(records, failed[target]['to'])}: "
                                             f"both links fail ({failed[target]['error']})", 1.0))
        elif not any(t.get("to") == prober for t in failed.values()):  # else its own in-link failed too: named as the target
            found[prober] = Finding(prober, _host(records, prober), "fabric", f"to {_host(records, target)}: {link['error']}", 1.0)
    return list(found.values())


def _figures(records: Mapping[int, Mapping[str, Any]], read: Callable, into: Mapping[int, int]) -> dict[int, tuple[float, str | None]]:
    """Every node's figure for one measure, with its words where the reader gives them (a node's
    ring links); nodes without the figure left out."""
    found = {}
    for node in records:
        value = read(records, node, into)
        if value is not None:
            found[node] = value if isinstance(value, tuple) else (value, None)
    return found


def medians(records: Mapping[int, Mapping[str, Any]]) -> str:
    """Each measure's median over the nodes, in words: ``compute 68.4 GFLOP/s, fabric 2.3 GB/s, ...``;
    per kind where the nodes are of several (``compute 68.4 GFLOP/s (AMD EPYC 7763, 64 threads) ...``)."""
    said = []
    into = incoming(records)
    for measure, read, key, _lower, kind in MEASURES:
        groups = by_kind(records, _figures(records, read, into), kind)
        for name, figures in sorted(groups.items()):
            median = _say(key, median_of(value for value, _ in figures.values()))
            said.append(f"{measure} {median}" + (f" ({name})" if len(groups) > 1 else ""))
    return ", ".join(said)


def _infiniband(records: Mapping[int, Mapping[str, Any]]) -> list[Finding]:
    active = {n: r["figures"]["ib_active"] for n, r in records.items() if isinstance(r.get("figures", {}).get("ib_active"), int)}
    if len(active) < 2:
        return []
    median = median_of(active.values())
    return [Finding(n, _host(records, n), "InfiniBand", f"{count} port(s) active (median node {median:g})", 1 - count / median if median else 0.0)
            for n, count in sorted(active.items()) if count < median]


def unmeasured(records: Mapping[int, Mapping[str, Any]]) -> list[str]:
    """What was not measured, said once for all the nodes that could not; and what could not be
    judged: a node alone of its kind."""
    counts: dict[str, int] = {}
    for record in records.values():
        for what in record.get("unmeasured", []):
            counts[what] = counts.get(what, 0) + 1
    said = [f"{what} on {count} node{'s' if count != 1 else ''}" for what, count in sorted(counts.items())]
    if len({r.get("host") for r in records.values()}) < 2:
        return said
    into = incoming(records)
    alone: dict[int, list[str]] = {}
    for measure, read, _key, _lower, kind in MEASURES:
        groups = by_kind(records, _figures(records, read, into), kind)
        if len(groups) > 1:
            for name, figures in groups.items():
                if len(figures) == 1:
                    alone.setdefault(next(iter(figures)), []).append(f"{measure} ({name or 'kind unknown'})")
    said += [f"{_host(records, node)}'s {', '.join(measures)}: no other node of its kind to compare with"
             for node, measures in sorted(alone.items())]
    return said


def ranking(records: Mapping[int, Mapping[str, Any]], findings: list[Finding], nnodes: int) -> list[int]:
    """Every node from worst to best: a node that sent no record before any that did (a job that
    keeps it waits for it), then the most findings, then the lowest figure relative to its kind's
    median, over every measure (a latency inverted)."""
    into = incoming(records)
    worst: dict[int, float] = {n: 1.0 if n in records else -1.0 for n in range(nnodes)}  # a node that sent nothing is the worst
    for _measure, read, _key, lower_better, kind in MEASURES:
        for figures in by_kind(records, _figures(records, read, into), kind).values():
            if len(figures) < 2:
                continue
            median = median_of(value for value, _ in figures.values())
            for node, (value, _words) in figures.items():
                ratio = (median / value if value else 0.0) if lower_better else (value / median if median else 1.0)
                worst[node] = min(worst[node], ratio)
    counts = {n: 0 for n in range(nnodes)}
    for finding in findings:
        counts[finding.node] += 1
    return sorted(range(nnodes), key=lambda n: (n in records, -counts[n], worst[n], n))

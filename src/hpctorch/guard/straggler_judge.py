"""The straggler watch's judgement (pure): every rank's share of the window inside collectives
in, the stragglers out, each with its figures, its evidence and the rule it was named by."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ..median import median
from ..plan.types import Plan

THROTTLED_AT = 0.5
"""A node whose CPU quota held its ranks back in at least this share of the scheduler's periods
(cgroup ``cpu.stat``) is named while the others wait: frozen inside a collective it slows everyone
alike, and its share of time inside collectives alone would not show it."""
MIN_COLLECTIVES = 3
"""Collectives a rank must have finished in a window to be judged (a rank that only started)."""


@dataclass(frozen=True)
class Straggler:
    ranks: tuple[int, ...]
    node: str
    compute_ratio: float
    """The straggler's time outside collectives over the median rank's."""
    others_wait: float
    """The share of the others' time spent waiting for it: the median share inside collectives minus its own."""
    whole_node: bool
    throttled: float | None = None
    """The share of the scheduler's periods in which its CPU quota held it back, where one did."""

    @property
    def key(self) -> str:
        return self.node if self.whole_node else f"rank {self.ranks[0]}"

    def evidence(self, threshold: float, window_s: float) -> dict[str, object]:
        """What the verdict rests on, for the bad-node list and the closing summary: the figures,
        what they were compared with, and the rule."""
        said: dict[str, object] = {"by": "stragglers", "node": self.node, "ranks": list(self.ranks), "whole_node": self.whole_node,
                                   "others_wait": round(self.others_wait, 4), "threshold": threshold,
                                   "window_s": window_s}
        if self.compute_ratio > 0:
            said["compute_ratio"] = round(self.compute_ratio, 3)
        if self.throttled is not None:
            said.update(throttled=self.throttled, throttled_at=THROTTLED_AT)
        return said

    def line(self) -> str:
        who = (f"node {self.node} ({_ranks(self.ranks)})" if self.whole_node else f"rank {self.ranks[0]} ({self.node})")
        quota = (f"its CPU quota held it back in {self.throttled:.0%} of the scheduler's periods (cgroup cpu.stat)"
                 if self.throttled is not None else "")
        if self.compute_ratio <= 0:  # named for its quota alone
            return f"hpctorch: straggler: {who}: {quota}, while the others spend {self.others_wait:.0%} of their time inside collectives"
        return (f"hpctorch: straggler: {who} computes {self.compute_ratio:.1f}x the median step "
                f"(others wait {self.others_wait:.0%} of each step for it)" + (f"; {quota}" if quota else ""))

    def rule(self, threshold: float, window_s: float) -> str:
        """The rule it was judged by, in words: said with the verdict where it is kept."""
        return (f"named at {threshold:.0%} or more of the others' time spent waiting, over {window_s:g} s"
                + (f"; a quota holding a node back in {THROTTLED_AT:.0%} of periods" if self.throttled is not None else ""))


def _ranks(ranks: Sequence[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + (f"{ranks[0]}-{ranks[-1]}" if list(ranks) == list(range(ranks[0], ranks[-1] + 1)) else ",".join(map(str, ranks)))


def node_name(plan: Plan, node: int, hosts: Mapping[int, str] | None = None) -> str:
    """The node's name: the plan's, else the one its record gave (per task), else its number."""
    if plan.nodes and node < len(plan.nodes):
        return plan.nodes[node]
    return (hosts or {}).get(node) or f"node {node}"


def judge(shares: Mapping[int, Mapping[int, Sequence[float]]], plan: Plan, threshold: float,
          throttled: Mapping[int, float] | None = None, hosts: Mapping[int, str] | None = None) -> list[Straggler]:
    """``shares[node][rank] = (share of the window inside collectives, collectives)``. A rank
    whose share is at least ``threshold`` below the median of the others' is a straggler, when
    it ran about as many collectives as the median rank (else it is doing other work, not
    comparable) and at most half the ranks are: the others must be the waiting majority.
    ``throttled[node]``: the share of periods its CPU quota held it back; at ``THROTTLED_AT`` or
    more, while the other nodes' ranks spend ``threshold`` of their time inside collectives, the
    node is named for it (on its line if it straggles anyway)."""
    measured = [(node, int(rank), float(v[0]), float(v[1])) for node, ranks in shares.items() for rank, v in ranks.items()]
    if len(measured) < 2:
        return []
    found = _by_share(measured, shares, plan, threshold, hosts)
    throttled = {n: t for n, t in (throttled or {}).items() if t >= THROTTLED_AT and shares.get(n)}  # a node with ranks measured
    if not throttled or len(throttled) * 2 > len(shares):
        return found
    named = {s.node: i for i, s in enumerate(found)}
    for node, share in sorted(throttled.items()):
        name = node_name(plan, node, hosts)
        others = [v for n, _r, v, _c in measured if n not in throttled]
        waiting = median(others) if others else 0.0
        if waiting < threshold:
            continue  # nobody waits: a quota that does not hold the job back
        if name in named:
            index = named[name]
            found[index] = replace(found[index], throttled=share)
            continue
        ranks = tuple(sorted(int(r) for r in shares[node]))
        found.append(Straggler(ranks, name, 0.0, waiting, True, share))
    return found


def _by_share(measured: list[tuple[int, int, float, float]], shares: Mapping[int, Mapping[int, Sequence[float]]], plan: Plan,
              threshold: float, hosts: Mapping[int, str] | None = None) -> list[Straggler]:
    """The ranks whose share inside collectives is ``threshold`` below the others'."""
    ordered = sorted(share for *_, share, _n in measured)
    usual = median(count for *_, count in measured)
    slow = []
    for node, rank, share, count in measured:
        others = _median_without(ordered, share)
        if count >= max(MIN_COLLECTIVES, usual / 2) and others - share >= threshold:
            slow.append((node, rank, share, others))
    if not slow or len(slow) * 2 > len(measured):
        return []
    found = []
    for node in sorted({node for node, *_ in slow}):
        mine = sorted((rank, share, others) for n, rank, share, others in slow if n == node)
        whole = len(mine) > 1 and len(mine) == len(shares[node])
        for group in [mine] if whole else [[one] for one in mine]:
            _rank, share, others = min(group, key=lambda one: one[1])
            ratio = (1.0 - share) / max(1.0 - others, 0.01)
            found.append(Straggler(tuple(rank for rank, *_ in group), node_name(plan, node, hosts), ratio, others - share, whole))
    return found


def _median_without(ordered: Sequence[float], value: float) -> float:
    """The median of sorted ``ordered`` with one ``value`` taken out: O(log n), not a new list."""
    import bisect

    gone = bisect.bisect_left(ordered, value)
    rest = len(ordered) - 1

    def at(i: int) -> float:
        return ordered[i if i < gone else i + 1]

    return at(rest // 2) if rest % 2 else (at(rest // 2 - 1) + at(rest // 2)) / 2

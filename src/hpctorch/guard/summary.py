"""The closing summary node 0 prints when a per-node job ends, and its JSON form; with the
straggler watch's per-rank table of time inside collectives."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from ..median import median as median_of
from ..plan.types import Plan
from ..schedulers import hostlist
from .goodput import line as goodput_line
from .stragglers import SHOWN_RANKS, node_name


@dataclass(frozen=True)
class Summary:
    exit_code: int
    wall_s: float
    nodes: tuple[str, ...]
    succeeded: tuple[int, ...]
    """Node ranks whose workers all exited 0 (as their watchdogs said)."""
    start_s: Mapping[int, float] = field(default_factory=dict)
    """Seconds from each node's hpctorch start to its workers' start."""
    logs: str | None = None
    failure: str | None = None
    ranks: tuple[dict, ...] = ()
    """Per rank, its share of the run inside collectives (the straggler watch), by rank."""
    replaced: tuple[int, ...] = ()
    """Node ranks that left the job to a hot spare (``--spare-nodes`` with ``--max-restarts``)."""
    stragglers_named: tuple[dict, ...] = ()
    """Each straggler the watch named during the run, with its evidence and rule (``Straggler.evidence``)."""
    goodput: Mapping[str, object] | None = None
    """Where the time went (``goodput.account``): to the first collective, training, lost to each restart."""

    @classmethod
    def of(cls, plan: Plan, exit_code: int, wall_s: float, final: Mapping[str, Mapping[int, object]],
           logs: str | None, failure: str | None, goodput: Mapping[str, object] | None = None) -> "Summary":
        names = plan.nodes or tuple(f"node {n}" for n in range(plan.nnodes))
        done = final.get("done") or ({0: exit_code == 0} if plan.nnodes == 1 else {})
        ranks = per_rank(final.get("stragglers") or {}, plan)  # type: ignore[arg-type]
        return cls(exit_code, wall_s, tuple(names), tuple(n for n, ok in sorted(done.items()) if ok),
                   {int(n): float(s) for n, s in (final.get("start_s") or {}).items()}, logs, failure,  # type: ignore[arg-type]
                   tuple(ranks), tuple(sorted(int(n) for n in (final.get("replaced") or {}))),
                   tuple(v for v in (final.get("stragglers_named") or ()) if isinstance(v, dict)), goodput)

    def lines(self) -> list[str]:
        """The closing line, the goodput, the stragglers named during the run (each with its
        evidence), then the per-rank table of time inside collectives where measured."""
        return [self.line(), *([goodput_line(dict(self.goodput))] if self.goodput else []), *named(self.stragglers_named), *table(self.ranks)]

    def line(self) -> str:
        if self.exit_code == 0:
            where = f"all {len(self.nodes)} node(s) ({hostlist.display(self.nodes)})"
            if not self.succeeded:
                # The watchdog's helpers start beside the workers and import torch first: a job over
                # before they reached node 0's store leaves node 0 nothing to read of the others.
                where = "this node; the job ended before the watchdog reached the other nodes (each node's own line says how it ended)"
            elif len(self.succeeded) + len(self.replaced) != len(self.nodes):
                others = [self.nodes[n] for n in range(len(self.nodes)) if n not in self.succeeded and n not in self.replaced]
                where = f"this node; not heard from: {hostlist.display(others)}"
            elif self.replaced:
                where = f"{hostlist.display(self.nodes[n] for n in self.succeeded)} and {len(self.replaced)} hot spare(s)"
            text = f"hpctorch: finished in {self.wall_s:.1f} s, exit 0 on {where}"
        else:
            # The failure itself is hpctorch's last line, after this summary and its table: said once.
            text = f"hpctorch: failed after {self.wall_s:.1f} s (exit {self.exit_code})"
        if self.replaced:
            text += f"; replaced by a hot spare: {hostlist.display(self.nodes[n] for n in self.replaced)}"
        if self.start_s:
            slowest = max(self.start_s, key=lambda n: self.start_s[n])
            text += f"; slowest start: {self.nodes[slowest]} ({self.start_s[slowest]:.1f} s to its workers)"
        if self.logs:
            where = f" on {self.nodes[0]} (each node keeps its own)" if len(self.nodes) > 1 else ""
            text += f"; per-rank logs: {self.logs}{where}"
        return text

    def write_json(self, path: str) -> None:
        data = asdict(self)
        data["start_s"] = {self.nodes[n]: s for n, s in self.start_s.items()}
        data["succeeded"] = [self.nodes[n] for n in self.succeeded]
        data["replaced"] = [self.nodes[n] for n in self.replaced]
        data["ranks"] = list(self.ranks)
        data["stragglers_named"] = list(self.stragglers_named)
        data["goodput"] = dict(self.goodput) if self.goodput else None
        with open(path, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=2)
            out.write("\n")


def per_rank(totals: Mapping[int, Mapping[int, Sequence[float]]], plan: Plan) -> list[dict]:
    """The closing summary's table: per rank, its share of the run inside collectives."""
    rows = []
    for node, ranks in sorted(totals.items()):
        for rank, (inside, span, count) in sorted(ranks.items()):
            if span > 0:
                rows.append({"rank": rank, "node": node_name(plan, node), "inside_share": round(inside / span, 4),
                             "inside_s": inside, "measured_s": span, "collectives": int(count)})
    return sorted(rows, key=lambda row: row["rank"])


def named(verdicts: Sequence[dict]) -> list[str]:
    """The stragglers named while the job ran: what, when, how often, and by which rule."""
    if not verdicts:
        return []
    first = verdicts[0]
    lines = [f"hpctorch: stragglers named during the run (others waiting {first.get('threshold', 0):.0%} or more of their time, "
             f"over {first.get('window_s', 0):g} s windows):"]
    for verdict in verdicts[:SHOWN_RANKS]:
        when = (f"at {verdict.get('first_s')} s" if verdict.get("judgements") == 1 else
                f"in {verdict.get('judgements')} judgements from {verdict.get('first_s')} s to {verdict.get('last_s')} s")
        lines.append(f"  {str(verdict.get('line', '')).removeprefix('straggler: ')} ({when})")
    if len(verdicts) > SHOWN_RANKS:
        lines.append(f"  ... and {len(verdicts) - SHOWN_RANKS} more (--summary-json has them all)")
    return lines


def table(rows: Sequence[dict]) -> list[str]:
    """Lines for the closing summary: every rank up to ``SHOWN_RANKS``, else the lowest shares."""
    if len(rows) < 2:
        return []
    median = median_of(row["inside_share"] for row in rows)
    shown = rows if len(rows) <= SHOWN_RANKS else sorted(rows, key=lambda row: row["inside_share"])[:SHOWN_RANKS // 2]
    title = "per rank" if len(rows) <= SHOWN_RANKS else f"the {len(shown)} ranks waiting least of {len(rows)}"
    lines = [f"hpctorch: time inside collectives, {title} (median {median:.0%}; the lowest is the one the others waited for):"]
    for row in shown:
        lines.append(f"  rank {row['rank']:>5}  {row['node']:<20} {row['inside_share']:>5.0%} of {row['measured_s']:.0f} s, "
                     f"{row['collectives']} collectives")
    return lines

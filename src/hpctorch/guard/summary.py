"""The closing summary node 0 prints when a per-node job ends, and its JSON form; with the
straggler watch's per-rank table of time inside collectives."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

from ..host.folders import read_without_link
from ..median import median as median_of
from ..plan.types import Plan
from ..schedulers import hostlist
from .goodput import Attempt, account, stalls_of
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
    job: str = ""
    """The scheduler's job (``slurm 63``), if any: a requeued job's runs add up in one ``--summary-json`` file."""
    earlier: tuple[dict, ...] = ()
    """The same job's earlier runs (a requeue), as that file kept them (``after``)."""

    @classmethod
    def of(cls, plan: Plan, exit_code: int, wall_s: float, final: Mapping[str, Mapping[int, object]],
           logs: str | None, failure: str | None, goodput: Mapping[str, object] | None = None) -> "Summary":
        names = plan.nodes or tuple(f"node {n}" for n in range(plan.nnodes))
        done = final.get("done") or ({0: exit_code == 0} if plan.nnodes == 1 else {})
        ranks = per_rank(final.get("stragglers") or {}, plan)  # type: ignore[arg-type]
        return cls(exit_code, wall_s, tuple(names), tuple(n for n, ok in sorted(done.items()) if ok),
                   {int(n): float(s) for n, s in (final.get("start_s") or {}).items()}, logs, failure,  # type: ignore[arg-type]
                   tuple(ranks), tuple(sorted(int(n) for n in (final.get("replaced") or {}))),
                   tuple(v for v in (final.get("stragglers_named") or ()) if isinstance(v, dict)), goodput,
                   f"{plan.scheduler} {plan.job_id}" if plan.job_id else "")

    def after(self, path: str) -> "Summary":
        """This run, after the same job's earlier runs that ``path`` (the last run's ``--summary-json``,
        this user's own file) holds: a job requeued (``run --requeue``, a preemption) adds up there."""
        if not self.job:
            return self
        try:
            facts, text = read_without_link(path)
            if facts.st_uid != os.getuid():
                return self  # not written by this user: nothing in it is this job's
            data = json.loads(text)
        except (OSError, ValueError):
            return self
        if not isinstance(data, dict) or data.get("job") != self.job:
            return self
        runs = data["runs"] if isinstance(data.get("runs"), list) else [_run(data)]
        return replace(self, earlier=tuple(run for run in runs if _is_run(run)))

    def lines(self) -> list[str]:
        """The closing line, the goodput, the stragglers named during the run (each with its
        evidence), then the per-rank table of time inside collectives where measured."""
        return [self.line(), *([goodput_line(dict(self.goodput))] if self.goodput else []), *self._across(),
                *named(self.stragglers_named), *table(self.ranks)]

    def _across(self) -> list[str]:
        """With earlier runs of the job: its goodput over all of them."""
        if not self.earlier:
            return []
        whole = across([*self.earlier, _run({"wall_s": self.wall_s, "exit_code": self.exit_code, "goodput": self.goodput})])
        return [f"hpctorch: {self.job} over {whole['runs']} runs ({len(self.earlier)} before this one): goodput {whole['share']:.0%}: "
                f"{whole['training_s']:.1f} s training of {whole['wall_s']:.1f} s"]

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
        del data["earlier"]
        if self.earlier:
            data["runs"] = [*self.earlier, _run(data)]
            data["job_goodput"] = across(data["runs"])
        with open(path, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=2)
            out.write("\n")


def _run(data: Mapping[str, object]) -> dict[str, object]:
    """One run of a job, as the next run's file keeps it."""
    return {"wall_s": data.get("wall_s"), "exit_code": data.get("exit_code"), "goodput": data.get("goodput")}


def _is_run(run: object) -> bool:
    """A run as ``_run`` keeps it: its figures numbers (an edited file's other shapes are left out)."""
    if not isinstance(run, dict) or not isinstance(run.get("wall_s"), (int, float)):
        return False
    goodput = run.get("goodput")
    return goodput is None or (isinstance(goodput, dict) and isinstance(goodput.get("training_s", 0.0), (int, float)))


def across(runs: Sequence[Mapping[str, object]]) -> dict[str, object]:
    """A job's goodput over its runs: their wall time and training added up."""
    wall = sum(float(run.get("wall_s") or 0.0) for run in runs)  # type: ignore[arg-type]
    training = sum(float((run.get("goodput") or {}).get("training_s") or 0.0) for run in runs  # type: ignore[union-attr]
                   if isinstance(run.get("goodput"), dict))
    return {"runs": len(runs), "wall_s": round(wall, 3), "training_s": round(training, 3), "share": round(training / wall, 4) if wall else 0.0}


def report(plan: Plan, started: float, final: Mapping[str, Mapping[int, object]], logs: str | None, exit_code: int,
           failure: str | None, attempts: Sequence[Attempt], alone: object, quiet: bool, path: str | None) -> None:
    """Node 0's closing words, whichever starter ran the workers, for a run that began at ``started``
    (epoch): the summary, with the goodput of its ``attempts``, node 0's stages (``timings``) and
    stalls (its judge's in ``final``, or on one node ``alone``'s), printed unless ``quiet`` and
    written to ``path`` (``--summary-json``) after the same job's earlier runs there."""
    from .. import timings

    since_start, now = time.time() - started, time.monotonic()
    goodput = account(now - since_start, now, attempts, timings.marks(), stalls_of(final, alone))
    summary = Summary.of(plan, exit_code, since_start, final, logs, failure, goodput)
    if path:
        summary = summary.after(path)
    if not quiet:
        print("\n".join(summary.lines()), file=sys.stderr, flush=True)
    if path:
        summary.write_json(path)


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

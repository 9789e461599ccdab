"""``hpctorch timeline SUMMARY.json``: node 0's closing summary (``--summary-json``) drawn as one
self-contained HTML page (inline SVG and CSS, no script, nothing fetched): a row per node, its
start, then the job's attempts as node 0 saw them: training from each attempt's first collective,
each failure, the time each restart lost, the stalls (no rank wrote output: ``--stall-timeout``);
node 0's start-up stages on its row; the hot spares that took a seat, the stragglers named."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

from .goodput import line as goodput_line

WIDTH, LABEL, ROW, TOP = 960, 150, 26, 20
COLOURS = {"start": "#9aa5b1", "waiting": "#d9dee3", "training": "#2e9e5b", "stall": "#f2c14e", "lost": "#e8833a", "failure": "#c62828"}


def render(summary: Mapping[str, object]) -> str:
    """The page for ``summary`` (``Summary.write_json``'s fields)."""
    nodes = [str(n) for n in summary.get("nodes") or []]  # type: ignore[union-attr]
    wall = float(summary.get("wall_s") or 0.0) or 1.0  # type: ignore[arg-type]
    goodput = summary.get("goodput") if isinstance(summary.get("goodput"), dict) else None
    starts = summary.get("start_s") if isinstance(summary.get("start_s"), dict) else {}
    replaced = {str(n) for n in summary.get("replaced") or []}  # type: ignore[union-attr]
    attempts = [a for a in (goodput or {}).get("attempts") or [] if isinstance(a, dict)]
    stages = [s for s in (goodput or {}).get("start_stages") or [] if isinstance(s, dict)]
    stalls = [s for s in (goodput or {}).get("stalls") or [] if isinstance(s, dict)]
    scale = (WIDTH - LABEL - 20) / wall
    rows = []
    for index, node in enumerate(nodes):
        y = TOP + index * ROW
        shapes = [f'<text x="4" y="{y + 16}" class="label">{escape(node)}</text>']
        begun = float(starts.get(node, 0.0) or 0.0)  # type: ignore[union-attr]
        if begun:
            shapes += _start(node, begun, stages if index == 0 else [], y, scale)
        if node in replaced:  # when it left is not in the summary: its row says that it did
            shapes.append(f'<text x="{LABEL + begun * scale + 6:.1f}" y="{y + 16}" class="note">left the job to a hot spare</text>')
        else:
            shapes += _attempts(attempts, begun, y, scale)
            shapes += [_bar(float(s.get("from_s") or 0.0), float(s.get("to_s") or 0.0), y, scale, "stall",
                            f"stalled: no rank wrote output from {float(s.get('from_s') or 0.0):.1f} s to {float(s.get('to_s') or 0.0):.1f} s")
                       for s in stalls]
        rows.append(f'<g class="row" data-node="{escape(node)}">{"".join(shapes)}</g>')
    height = TOP + len(nodes) * ROW + 40
    axis = "".join(f'<text x="{LABEL + t * scale:.1f}" y="{height - 12}" class="tick">{t:g} s</text>'
                   for t in _ticks(wall))
    return _PAGE.format(title=escape(_title(summary)), said=_said(summary, goodput), width=WIDTH, height=height,
                        rows="".join(rows), axis=axis, legend=_legend(), stragglers=_stragglers(summary.get("stragglers_named")))


def _attempts(attempts: Sequence[Mapping], begun: float, y: int, scale: float) -> list[str]:
    shapes, since = [], begun
    for number, attempt in enumerate(attempts):
        first, ended = attempt.get("first_s"), float(attempt.get("ended_s") or 0.0)
        if isinstance(first, (int, float)):
            if first > since:
                shapes.append(_bar(since, float(first), y, scale, "waiting" if number == 0 else "lost",
                                   f"attempt {number}: {float(first) - since:.1f} s to its first collective"))
            shapes.append(_bar(float(first), ended, y, scale, "training", f"attempt {number}: training {ended - float(first):.1f} s"))
        elif ended > since:
            shapes.append(_bar(since, ended, y, scale, "lost", f"attempt {number}: no collective completed"))
        if number < len(attempts) - 1:
            x = LABEL + ended * scale
            shapes.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y + 2}" y2="{y + ROW - 4}" class="failure">'
                          f'<title>attempt {number} ended: a restart</title></line>')
        since = ended
    return shapes


def _start(node: str, begun: float, stages: Sequence[Mapping], y: int, scale: float) -> list[str]:
    """The row's start: one bar, or on node 0 one per stage it marked on the way (``timings.mark``)."""
    shapes, since = [], 0.0
    for stage in stages:
        at = min(float(stage.get("at_s") or 0.0), begun)
        if at > since:
            shapes.append(_bar(since, at, y, scale, "start", f"{node}: {stage.get('stage')} at {at:.1f} s"))
            since = at
    if begun > since:
        shapes.append(_bar(since, begun, y, scale, "start", f"{node}: {begun:.1f} s to its workers"))
    return shapes


def _bar(start: float, end: float, y: int, scale: float, kind: str, title: str) -> str:
    return (f'<rect x="{LABEL + start * scale:.1f}" y="{y + 4}" width="{max(1.0, (end - start) * scale):.1f}" height="{ROW - 8}" '
            f'class="{kind}"><title>{escape(title)}</title></rect>')


def _ticks(wall: float) -> list[float]:
    """At most about ten round times along the axis."""
    for step in (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0):
        if wall / step <= 10:
            break
    else:
        step = wall / 10
    return [n * step for n in range(int(wall // step) + 1)]


def _title(summary: Mapping[str, object]) -> str:
    code = summary.get("exit_code")
    return f"hpctorch timeline: {len(summary.get('nodes') or [])} node(s), {float(summary.get('wall_s') or 0):.1f} s, exit {code}"  # type: ignore[arg-type]


def _said(summary: Mapping[str, object], goodput: Mapping | None) -> str:
    lines = [goodput_line(dict(goodput)).removeprefix("hpctorch: ")] if goodput else ["no collective completed: nothing trained"]
    whole = summary.get("job_goodput")
    if isinstance(whole, dict) and whole.get("runs"):
        lines.append(f"{summary.get('job')} over {whole.get('runs')} runs: goodput {float(whole.get('share') or 0):.0%}: "
                     f"{float(whole.get('training_s') or 0):.1f} s training of {float(whole.get('wall_s') or 0):.1f} s (this page: the last run)")
    if summary.get("failure"):
        lines.append(f"failed: {summary['failure']}")
    return "".join(f"<p>{escape(text)}</p>" for text in lines)


def _legend() -> str:
    names = {"start": "to the workers", "waiting": "to the first collective", "training": "training", "stall": "stalled",
             "lost": "lost to a restart", "failure": "an attempt ended"}
    return "".join(f'<span class="key"><i style="background:{COLOURS[kind]}"></i>{escape(text)}</span>' for kind, text in names.items())


def _stragglers(named: object) -> str:
    verdicts = [v for v in named or [] if isinstance(v, dict)]  # type: ignore[union-attr]
    if not verdicts:
        return ""
    items = "".join(f"<li>{escape(str(v.get('line', '')))} (from {v.get('first_s')} s to {v.get('last_s')} s of the watch)</li>" for v in verdicts)
    return f"<h2>Stragglers named</h2><ul>{items}</ul>"


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font: 14px system-ui, sans-serif; margin: 24px; color: #1d2730; }}
svg text.label {{ font-size: 13px; }} svg text.tick, svg text.note {{ font-size: 11px; fill: #52606d; }}
rect.start {{ fill: """ + COLOURS["start"] + """; }} rect.waiting {{ fill: """ + COLOURS["waiting"] + """; }}
rect.training {{ fill: """ + COLOURS["training"] + """; }} rect.lost {{ fill: """ + COLOURS["lost"] + """; }}
rect.stall {{ fill: """ + COLOURS["stall"] + """; }} rect.start {{ stroke: #fff; stroke-width: 1; }}
line.failure {{ stroke: """ + COLOURS["failure"] + """; stroke-width: 3; }}
.key {{ margin-right: 16px; }} .key i {{ display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: -1px; }}
</style></head>
<body><h1>{title}</h1>{said}<div>{legend}</div>
<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" aria-label="one row per node">{rows}{axis}</svg>
{stragglers}</body></html>
"""

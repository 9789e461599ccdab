"""The straggler watch (``--stragglers``, on by default): node 0 names the rank, or the node,
that makes everyone wait, while the job runs.

Each worker keeps its running time inside collectives in a file of the node's private folder
(``straggler_worker``). Every ``PUBLISH_S`` each node's watchdog turns its ranks' files into the
share of the last ``window_s`` each rank spent inside collectives, and sets that as one small
record, ``hpctorch/<run id>/straggle/<node>``: one request per node per 10 s, whatever N. Node 0
reads all records in one ``multi_get`` and judges (``straggler_judge``, pure): a rank that spends at least
``threshold`` (default 0.2) less of its time inside collectives than the median of the others is
the one they wait for; so is a node whose CPU quota held its ranks back in half of the
scheduler's periods (its workers' cgroup ``cpu.stat``) while the others wait: frozen inside a
collective it slows everyone alike, and no time share shows it. Node 0 prints one line per
straggler found in ``CONFIRM_JUDGEMENTS`` judgements on end (not a rank still warming up), again
at most every ``REPEAT_S`` while it lasts, and adds a node of a several-node job that straggled
for two windows on end to the user's bad-node list only on evidence about the node itself (its
CPU quota held it back): a rank that computes more for its role (a pipeline's
last stage, a rank 0 that also evaluates) or a node slowed for a while by its neighbours looks
the same in time shares, and is named, never listed. At the end every node's
running totals make the closing summary's per-rank table.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..errors import HpctorchError
from ..plan.types import Plan
from .straggler_judge import Straggler, judge, node_name

MODE_ENV, THRESHOLD_ENV, WINDOW_ENV = "HPCTORCH_STRAGGLERS", "HPCTORCH_STRAGGLER_THRESHOLD", "HPCTORCH_STRAGGLER_WINDOW_S"
DEFAULT_THRESHOLD = 0.2
DEFAULT_WINDOW_S = 30.0
PUBLISH_S = 10.0
REPEAT_S = 300.0
FULL_WINDOW = 0.9
"""The share of a window a rank must have been measured for to be judged (its files' times are
irregular: a window is rarely exactly full)."""
CONFIRM_JUDGEMENTS = 2
"""A rank is named once found in this many judgements on end: one window can catch a rank still
warming up (its first steps, a late start on a loaded node), and that is no straggler."""
LIST_AFTER_WINDOWS = 2
"""A node goes on the bad-node list once named in every judgement for this many windows: rank 0's
evaluation or checkpoint makes everyone wait for a while, and is no fault of its node."""
MIN_PERIODS = 20
SHOWN_RANKS = 16


@dataclass(frozen=True)
class Settings:
    threshold: float = DEFAULT_THRESHOLD
    window_s: float = DEFAULT_WINDOW_S

    @property
    def publish_s(self) -> float:
        """How often a node sends its record (three times a window, at most every ``PUBLISH_S``)."""
        return min(PUBLISH_S, self.window_s / 3)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Settings | None":
        """None when the watch is off (``--stragglers off``); HpctorchError for a value that is not one."""
        mode = env.get(MODE_ENV) or "warn"
        if mode not in ("off", "warn"):
            raise HpctorchError(f"{MODE_ENV}={mode} is neither off nor warn", f"set {MODE_ENV}=off or warn, or unset it")
        if mode == "off":
            return None
        threshold, window = _number(env, THRESHOLD_ENV, DEFAULT_THRESHOLD), _number(env, WINDOW_ENV, DEFAULT_WINDOW_S)
        if not 0 < threshold < 1:
            raise HpctorchError(f"{THRESHOLD_ENV}={threshold:g} is not a fraction between 0 and 1", "give e.g. 0.2")
        if window < 1:
            raise HpctorchError(f"{WINDOW_ENV}={window:g} is shorter than a second", "give the window in seconds, e.g. 30")
        return cls(threshold, window)


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    try:
        return float(env.get(name) or default)
    except ValueError:
        raise HpctorchError(f"{name}={env.get(name)} is not a number", f"give a number, or unset {name}") from None


class NodeWindow:
    """This node's ranks' files, turned into each rank's share of the last ``window_s`` inside
    collectives, and the running totals."""

    def __init__(self, directory: str, window_s: float) -> None:
        self.directory = directory
        self.window_s = window_s
        self.history: dict[int, deque[tuple[float, float, float]]] = {}
        """Per local rank (its file), the samples of about the last window."""
        self.first: dict[int, tuple[float, float, float]] = {}
        self.rank: dict[int, int] = {}
        self.cgroups: dict[str, deque[tuple[float, int, int]]] = {}
        """Per cpu.stat of this node's workers: (monotonic time, periods, throttled periods)."""
        self._stat_of: dict[int, str | None] = {}

    def read(self) -> None:
        try:
            names = os.listdir(self.directory)
        except OSError:
            return
        for name in names:
            local = name.removesuffix(".json")
            if not (name.endswith(".json") and local.isdigit()):
                continue
            try:
                with open(os.path.join(self.directory, name), encoding="utf-8") as source:
                    data = json.load(source)
                sample = (float(data["t"]), float(data["inside_s"]), float(data["count"]))
                rank = int(data["rank"])
                self._note_cgroup(int(data.get("pid") or 0))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # being replaced, or not ours to understand
            seen = self.history.setdefault(int(local), deque())
            if seen and (sample[2] < seen[-1][2] or rank != self.rank.get(int(local))):
                seen.clear()  # a restarted worker counts from zero
                self.first.pop(int(local), None)
            if not seen or sample[0] > seen[-1][0]:
                seen.append(sample)
                self.first.setdefault(int(local), sample)
                self.rank[int(local)] = rank
            while len(seen) > 2 and seen[1][0] <= sample[0] - self.window_s:
                seen.popleft()  # keep one sample at least a window old

    def _note_cgroup(self, pid: int) -> None:
        if pid and pid not in self._stat_of:
            from ..host.cgroups import cpu_stat_path

            self._stat_of[pid] = path = cpu_stat_path(pid)
            if path:
                self.cgroups.setdefault(path, deque())

    def sample_cgroups(self, now: float) -> None:
        from ..host.cgroups import periods

        for path, seen in self.cgroups.items():
            counters = periods(path)
            if counters is not None:
                seen.append((now, *counters))
                while len(seen) > 2 and seen[1][0] <= now - self.window_s:
                    seen.popleft()

    def throttled(self) -> float | None:
        """The largest share of periods in which a quota held this node's workers back, over
        about the last window; None without a quota that counted enough periods."""
        shares = []
        for seen in self.cgroups.values():
            if len(seen) >= 2 and seen[-1][1] - seen[0][1] >= MIN_PERIODS:
                shares.append((seen[-1][2] - seen[0][2]) / (seen[-1][1] - seen[0][1]))
        return round(max(shares), 3) if shares else None

    def shares(self) -> dict[int, list[float]]:
        """Per rank: [share inside collectives, collectives], over about the last window; none
        for a rank measured for less (a short first window makes its warm-up count double)."""
        out = {}
        for local, seen in self.history.items():
            (t0, in0, n0), (t1, in1, n1) = seen[0], seen[-1]
            if t1 - t0 >= FULL_WINDOW * self.window_s:
                out[self.rank[local]] = [round(min(1.0, (in1 - in0) / (t1 - t0)), 4), n1 - n0]
        return out

    def totals(self) -> dict[int, list[float]]:
        """Per rank: [seconds inside collectives, seconds measured, collectives], since its first file."""
        out = {}
        for local, seen in self.history.items():
            if seen:
                (t0, in0, n0), (t1, in1, n1) = self.first[local], seen[-1]
                out[self.rank[local]] = [round(in1 - in0, 3), round(t1 - t0, 3), n1 - n0]
        return out


class Watch:
    """One node's side of the watch, and node 0's judgement. ``step`` runs every ``PUBLISH_S``
    in the watchdog's thread (with its store), or alone on a one-node job (``store`` None)."""

    def __init__(self, plan: Plan, settings: Settings, directory: str, say: Callable[[str], None] | None = None) -> None:
        self.plan = plan
        self.settings = settings
        self.window = NodeWindow(directory, settings.window_s)
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.prefix = f"hpctorch/{plan.run_id}/straggle/"
        self.host = node_name(plan, plan.node_rank) if plan.nodes else _hostname()
        self.said: dict[str, float] = {}
        self.spell: dict[str, tuple[float, int]] = {}
        """Per node named in the last judgement: when its spell began (named without a break, for
        its rank's share or its quota alike), and in how many judgements."""
        self.held_back: dict[str, float] = {}
        """Per node in its present spell: the most its CPU quota held it back (the evidence to list it)."""
        self.pending: dict[str, tuple[str, dict[str, object]]] = {}
        """Per straggler of a spell not yet ``CONFIRM_JUDGEMENTS`` long: its node and its verdict so far."""
        self.listed: set[str] = set()
        self.started: float | None = None
        """The first judgement's clock: verdicts say their times from it."""
        self.verdicts: dict[str, dict[str, object]] = {}
        """Per straggler named in this run (node 0): its latest evidence, when first and last
        named, and in how many judgements; the closing summary's ``stragglers_named``."""
        self.requests = 0
        self._all_published = False

    def key(self, node: int) -> str:
        return f"{self.prefix}{node}"

    def announce(self, store) -> None:  # type: ignore[no-untyped-def]
        """Before the first beat: node 0's ``multi_get`` of every record never waits for one."""
        self.requests += 1
        store.set(self.key(self.plan.node_rank), json.dumps({"w": {}, "all": {}}))

    def step(self, store, now: float) -> list[Straggler]:  # type: ignore[no-untyped-def]
        started = self.started = now if self.started is None else self.started
        self.window.read()
        self.window.sample_cgroups(now)
        record: dict = {"w": self.window.shares(), "all": self.window.totals(), "h": self.host}
        throttled = self.window.throttled()
        if throttled is not None:
            record["thr"] = throttled
        if store is None:
            records = {0: record}
        else:
            self.requests += 1
            store.set(self.key(self.plan.node_rank), json.dumps(record))
            if not self.plan.is_master:
                return []
            records = self._read_all(store)
        found = judge({n: {int(k): v for k, v in r.get("w", {}).items()} for n, r in records.items()}, self.plan, self.settings.threshold,
                      {n: float(r["thr"]) for n, r in records.items() if r.get("thr") is not None},
                      {n: str(r["h"]) for n, r in records.items() if r.get("h")})
        # Per node, whatever its lines say (its rank's share, its quota, or both, may come and go).
        spells = {s.node: self.spell.get(s.node, (now, 0)) for s in found}
        self.spell = {node: (began, count + 1) for node, (began, count) in spells.items()}
        self.held_back = held = {n: q for n, q in self.held_back.items() if n in self.spell}
        self.pending = {key: kept for key, kept in self.pending.items() if kept[0] in self.spell}
        confirmed = []
        for straggler in found:
            if straggler.throttled is not None:
                held[straggler.node] = max(held.get(straggler.node, 0.0), straggler.throttled)
            began, count = self.spell[straggler.node]
            pending = self.pending.get(straggler.key)
            kept = (pending[1] if pending else self.verdicts.get(straggler.key)) or {"first_s": round(now - started, 1), "judgements": 0}
            verdict = {**self._evidence(straggler), "line": straggler.line().removeprefix("hpctorch: "),
                       "first_s": kept["first_s"], "last_s": round(now - started, 1),
                       "judgements": int(kept["judgements"]) + 1}  # type: ignore[call-overload]
            if count < CONFIRM_JUDGEMENTS:
                self.pending[straggler.key] = (straggler.node, verdict)
                continue
            self.pending.pop(straggler.key, None)
            self.verdicts[straggler.key] = verdict
            confirmed.append(straggler)
            if now - self.said.get(straggler.key, -REPEAT_S) >= REPEAT_S:
                self.said[straggler.key] = now
                self.say(straggler.line())
            if now - began >= LIST_AFTER_WINDOWS * self.settings.window_s:
                self._list(straggler)
        return confirmed

    def _read_all(self, store) -> dict[int, dict]:  # type: ignore[no-untyped-def]
        keys = [self.key(n) for n in range(self.plan.nnodes)]
        if not self._all_published:
            self.requests += 1
            self._all_published = store.check(keys)
            if not self._all_published:
                return {}
        self.requests += 1
        records = {}
        for node, raw in enumerate(store.multi_get(keys)):
            try:
                records[node] = json.loads(raw)
            except ValueError:
                continue
        return records

    def _list(self, straggler: Straggler) -> None:
        """A node that straggled for ``LIST_AFTER_WINDOWS`` windows in a several-node job goes to
        the user's bad-node list, once (never a simulated one: they are all this machine)."""
        if self.plan.nnodes < 2 or self.plan.simulated or straggler.node.startswith("node ") or straggler.node in self.listed:
            return
        self.listed.add(straggler.node)
        if straggler.node not in self.held_back:
            self.say(f"hpctorch: {straggler.node} not put on the bad-node list: slow for {LIST_AFTER_WINDOWS} windows, but nothing "
                     "about the node says why (its CPU quota did not hold it back); a rank's larger share of the work looks the same")
            return
        from ..host import badnodes

        reason = f"straggler: {straggler.line().split(': ', 2)[-1]} ({straggler.rule(self.settings.threshold, self.settings.window_s)})"
        try:
            badnodes.add(os.environ, [straggler.node], reason, self.plan.job_id, self._evidence(straggler))
        except Exception as exc:  # noqa: BLE001 - advice for the next job, never in this one's way
            self.say(f"hpctorch: {straggler.node} not added to the bad-node list: {exc}")

    def _evidence(self, straggler: Straggler) -> dict[str, object]:
        return straggler.evidence(self.settings.threshold, self.settings.window_s)

    def publish_final(self, store) -> None:  # type: ignore[no-untyped-def]
        """This node's running totals, as its workers left them, for node 0's closing summary."""
        self.window.read()
        self.requests += 1
        store.set(self.key(self.plan.node_rank), json.dumps({"w": {}, "all": self.window.totals()}))

    def collect_final(self, store) -> dict[int, dict[int, list[float]]]:  # type: ignore[no-untyped-def]
        """Node 0, once every node is done: every node's running totals."""
        self._all_published = False
        return {n: {int(k): v for k, v in r.get("all", {}).items()} for n, r in self._read_all(store).items()}

    def closing(self, store, done: bool) -> dict[str, object]:  # type: ignore[no-untyped-def]
        """Node 0's part of the closing summary: every node's totals once all are done, and the
        stragglers named during the run."""
        return {"stragglers": self.collect_final(store) if done else {}, "stragglers_named": list(self.verdicts.values())}

    def local_final(self) -> dict[int, dict[int, list[float]]]:
        """A one-node job's totals."""
        self.window.read()
        return {0: self.window.totals()}


class Alone:
    """A one-node job's watch: the same judgement in a thread of the starter, with no store."""

    def __init__(self, watch: Watch) -> None:
        self.watch = watch
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hpctorch-stragglers", daemon=True)

    def start(self) -> "Alone":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.watch.settings.publish_s):
            self.watch.step(None, time.monotonic())

    def stop(self) -> dict[str, dict]:
        """The closing summary's part (``final["stragglers"]``)."""
        self._stop.set()
        self._thread.join(timeout=5)
        return {"stragglers": self.watch.local_final(), "stragglers_named": list(self.watch.verdicts.values())}


def _hostname() -> str:
    import socket

    return socket.gethostname()


PER_TASK_ENV = "HPCTORCH_STRAGGLERS_NODE"
"""Per task (the launcher started every rank, no hpctorch process beside them): in each node's
local rank 0, what it needs to be its node's side of the watch, through the job's own store."""


def per_task_spec(plan: Plan) -> str:
    """``PER_TASK_ENV``'s value: a few numbers, never the node list (an environment variable
    holds 128 KiB at most; the records carry each node's name)."""
    return json.dumps({"run_id": plan.run_id, "node_rank": plan.node_rank, "nnodes": plan.nnodes, "job_id": plan.job_id,
                       "scheduler": plan.scheduler})


def plan_of_task(spec: str) -> Plan:
    """The little of a Plan the watch reads, from ``per_task_spec``."""
    data = json.loads(spec)
    return Plan(mode="per-task", scheduler=str(data.get("scheduler") or ""), job_id=data.get("job_id"), nodes=(),
                node_rank=int(data["node_rank"]), nproc_per_node=(1,) * int(data["nnodes"]), master_addr=None, master_port=0,
                rdzv_backend="static", rdzv_timeout=0, run_id=str(data["run_id"]), iface=None, simulated=False, max_restarts=0,
                workers=(), common_env={})


def for_node(plan: Plan, directory: str | None, env: Mapping[str, str]) -> Watch | None:
    """This node's watch, when on and its workers have a folder (``stragglers_env``)."""
    settings = Settings.from_env(env)
    return Watch(plan, settings, directory) if settings is not None and directory else None

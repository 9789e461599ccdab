"""Whole-job teardown for per-node mode, through the store every agent already shares.

torch's static rendezvous serves a TCPStore on the master (multi-tenant), and each
node's agent is its client. The watchdog is one more client per node, under the key
prefix ``hpctorch/<run id>/``. Where hpctorch starts the workers itself, the same watchdog
runs in a helper process per node against a store node 0 serves (its hpctorch or its helper: ``nodewatch``).
Its load on the store is constant per node, whatever the node count (shared/DESIGN.md,
scale rules):
- every node, every ``POLL_S``: one ``add`` of 0 to the job's ``state`` counter (1: node 0
  finished, 2 or more: aborted), and every ``BEAT_EVERY`` polls one ``add`` to its own
  counter ``beat/<node>``: 2.5 requests per second per node, whatever N (10,000 nodes:
  25,000 small requests per second on node 0's store);
- node 0 alone judges: one ``multi_get`` of all counters per ``POLL_S``. A counter that
  stops moving for ``judge.SILENT_AFTER_S`` (a frozen node, or its link down) names the node
  in ``abort``. Counters are compared against node 0's clock only (no clock skew).
- ``abort``: a one-line summary, set by the node whose workers failed or by node 0's
  verdict, sealed with the run's secret (``authority``: each watchdog first authenticates node
  0's record in the store it watches, else runs unwatched and says so), then 2 added to
  ``state``; every node that reads that, and finds the seal good, stops its workers through
  the torch agent's own SIGTERM handling, and adds one to ``ack``.
- a node whose workers all succeeded sets its counter to ``done``; node 0 also adds 1 to
  ``state``, so a node still finishing when node 0's store goes away is not alarmed.
Node 0 serves the store: before its agent exits it waits (at most ``LINGER_S``) until
every node has read the abort, or finished, so nobody sees "store gone" instead of the cause,
then prints the survivors' stacks every node took at teardown (``stacks.job``).

With ``--stall-timeout`` every node also adds one to ``out/<node>`` in a poll where its
workers' output grew, and reads the counter ``stacks/want`` (one request); node 0 reads every
``out`` in one ``multi_get``. Once any moved (a rank wrote something: the start before has
timeouts of its own), when none moved for the timeout, node 0 asks for a dump (the stall's
number, sealed, in ``stacks/asked``, then one added to ``stacks/want``, which wakes the nodes:
each answers a number once, so a dump again only after output resumed and stalled again; a
stranger's add asks for nothing) or, with ``--stall-action kill``, sets ``abort``. That runs in
a thread of its own: sizing the logs (on a stalled shared file system) or taking stacks never
delays a beat.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..plan.types import Plan
from ..terminal import printable
from . import failures
from .judge import Judge, StallWatch  # noqa: F401 - StallWatch: the starters build it from here
from .keys import DONE, REPLACED, beat_key, stall_dump_keys
from .stragglers import Watch

if TYPE_CHECKING:
    from .authority import Seal

POLL_S = 0.5
BEAT_EVERY = 4
"""Polls per heartbeat: a beat every 2 s, five in the silence window; the abort is read every poll."""
UNREACHABLE_AFTER_S = 3.0
AUTH_TRIES = 4
"""Tries at authenticating the watched store (node 0's record, ``authority.verify``)."""
STORE_TIMEOUT_S = 2
LINGER_S = 5.0
FINISHED, ABORTED = 1, 2
"""Values of the ``state`` counter: node 0 adds 1 when its workers succeeded, a node that
aborts adds 2 (so any value from 2 up means aborted, whatever else happened)."""
COLLECT_S = 3.0
"""How long node 0 waits for the other nodes' part of a stack dump."""


class JobWatchdog:
    def __init__(self, plan: Plan, connect_timeout_s: float, on_abort: Callable[[str], None] | None = None,
                 startup_s: float | None = None, stacks=None, stall: StallWatch | None = None,  # type: ignore[no-untyped-def]
                 endpoint: tuple[str, int] | None = None, all_up: Callable[[], float | None] | None = None,
                 stragglers: "Watch | None" = None, spares: int = 0) -> None:
        """``on_abort(reason)`` stops this node's workers; by default SIGTERM to this
        process, which the torch agent turns into stopping its workers. ``endpoint``: the
        store watched, when not the master's (``nodewatch``). ``all_up()``: when (monotonic) every
        node was known to be running, if it was, from which a node never heard from is named.
        ``stragglers``: this node's side of the straggler watch, stepped in a thread of its own.
        ``spares``: hot spares (``start.spares``): node 0 lets one take a silent node's place."""
        self.all_up = all_up
        self.plan = plan
        self.endpoint = endpoint or (plan.master_addr or "", plan.master_port)
        self.connected = threading.Event()
        """Set once this node reached the store (and stays set)."""
        self.on_abort = on_abort or (lambda _reason: os.kill(os.getpid(), signal.SIGTERM))
        self.prefix = f"hpctorch/{plan.run_id}/"
        self.connect_timeout_s = connect_timeout_s
        self.reason: str | None = None
        self.requests = 0
        """Store requests this node's watchdog made (the scale benchmark reads it)."""
        self._store = None
        self._seal: "Seal | None" = None
        """This run's seal, once node 0's record in the watched store authenticated: the abort is sealed."""
        self._forged: set[bytes] = set()
        self._acked = False
        self._recorded = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hpctorch-watchdog", daemon=True)
        # Sizing the logs and taking stacks can block (a stalled shared file system, py-spy, the
        # collection's wait): never in the beating thread, or node 0 would call a healthy node silent.
        self._side = threading.Thread(target=self._watch_output_loop, name="hpctorch-stall-watch", daemon=True)
        self._beats = [beat_key(plan.run_id, n) for n in range(plan.nnodes)] if plan.is_master else []
        self.startup_s = startup_s
        """Seconds from this node's hpctorch start to its workers' start; node 0 reads every node's."""
        self.final: dict[str, dict[int, object]] = {}
        """Node 0, once finished: each node's last state ("done" or not) and start-up seconds."""
        self._judge: Judge | None = None
        self.stacks = stacks
        """This node's ``stacks.job.NodeStacks``: stall and teardown dumps."""
        self.stall = stall
        self.teardown_lines: list[str] = []
        """Node 0, after an abort: the grouped stacks every node took at teardown."""
        self._outs = [f"{self.prefix}out/{n}" for n in range(plan.nnodes)] if plan.is_master else []
        self.stragglers = stragglers
        self._straggle = threading.Thread(target=self._straggle_loop, name="hpctorch-stragglers", daemon=True)
        self._output = 0
        """Bytes of this node's output last counted: ``out/<node>`` moves once they grow past it."""
        self._wanted = 0
        self._answered = 0  # the last stall whose dump this node took: node 0's sealed number for it
        self.spares = spares

    def start(self) -> "JobWatchdog":
        if self.plan.nnodes > 1 or self.stall is not None:
            self._thread.start()
        return self

    @property
    def store(self):  # type: ignore[no-untyped-def]
        """This node's connection to the master's store, while watching (else None), under the
        run's seal: the stacks a node sends are sealed, and node 0 shows only those that check."""
        return self._sealed(self._store)

    def _sealed(self, store):  # type: ignore[no-untyped-def]
        from .authority import SealedStore

        return SealedStore(store, self._seal) if store is not None and self._seal is not None else store

    def report_failure(self, summary: str, at: float | None = None) -> None:
        """Tell every node that this one failed (best effort: the store may be gone); ``at`` (wall
        clock), when its rank raised or died, goes into a failure record for every node's closing
        line (node 0's, and a failed node's own: the first failure in time among the first recorded)."""
        self._finish(self.prefix + "abort", summary, at)

    def record_failure(self, summary: str, at: float | None) -> bool:
        """Tell every node now, before this node stops its surviving workers (node 0's hold rank 0's
        store: its peers elsewhere would break on it and name themselves); ``report_failure`` later
        writes it no more. False when this node reached no store (yet)."""
        store = self._store
        if store is None or self._seal is None or self._recorded:
            return self._recorded
        try:
            self._set_abort(store, summary)
            if at is not None:
                failures.record(store, self._seal, self.prefix, self.plan.node_rank, summary, at)
        except Exception:  # noqa: BLE001 - the store's host may be gone: said again at the end
            return False
        self._recorded = True
        return True

    def _set_abort(self, store, reason: str) -> None:  # type: ignore[no-untyped-def]
        key = self.prefix + "abort"
        store.set(key, self._seal.seal(key, reason))  # type: ignore[union-attr]  # set once authenticated; the reason first
        store.add(self._state_key, ABORTED)

    def _sealed_abort(self, store) -> str | None:  # type: ignore[no-untyped-def]
        """The abort's reason, when this job wrote it; None (said once) for one anyone else wrote:
        a stranger who reaches the store must not stop the job's workers with words of their choosing."""
        from .authority import AuthError

        key = self.prefix + "abort"
        self.requests += 1
        raw = bytes(store.get(key)) if store.check([key]) else b""
        try:
            if not raw:
                raise AuthError("the job's state says aborted, with no reason recorded")
            return printable(self._seal.open(key, raw).decode(errors="replace"), lines=False)  # type: ignore[union-attr]
        except AuthError as exc:
            if raw not in self._forged:
                self._forged.add(raw)
                print(f"hpctorch: ignored an abort this job did not write ({exc.cause}); its workers go on "
                      "(docs/threat-model.md)", file=sys.stderr, flush=True)
            return None

    def finished(self) -> None:
        self._finish(self._beat_key(), DONE.decode())

    def replaced(self) -> None:
        """This node leaves the job to a hot spare: node 0 no longer waits for its beat."""
        self._finish(self._beat_key(), REPLACED.decode())

    @property
    def _state_key(self) -> str:
        return self.prefix + "state"

    def close(self) -> None:
        """Stop watching without telling anyone (the abort is already in the store)."""
        self._finish(None, "")

    def _beat_key(self) -> str:
        return beat_key(self.plan.run_id, self.plan.node_rank)

    def _finish(self, key: str | None, value: str, failed_at: float | None = None) -> None:
        # Join before the last write and before this process exits: a daemon thread
        # left inside a C++ store call at interpreter shutdown aborts the process.
        self._stop.set()
        for thread in (self._thread, self._side, self._straggle):
            if thread.is_alive():
                thread.join(timeout=STORE_TIMEOUT_S + POLL_S + 1)
        store, self._store = self._store, None
        if store is None:
            return
        try:
            if key is not None and key.endswith("abort"):
                if not self._recorded:
                    self._set_abort(store, value)
                    if failed_at is not None:
                        failures.record(store, self._seal, self.prefix, self.plan.node_rank, value, failed_at)
                self._ack(store)
                if failed_at is not None and not self.plan.is_master:
                    recorded = failures.read(store, self._seal, self.prefix)  # this node's line names an earlier failure elsewhere
                    if recorded:
                        self.final["failures"] = recorded
            elif key is not None:
                if self.stragglers is not None and value == DONE.decode():
                    self.stragglers.publish_final(store)  # before "done": node 0 reads every node's once all are done
                store.set(key, value)
                if value == DONE.decode() and self.plan.is_master:
                    store.add(self._state_key, FINISHED)
            if self.plan.is_master:
                self._linger(store)
                self.final = self._read_final(store)
                recorded = failures.read(store, self._seal, self.prefix)
                if recorded:
                    self.final["failures"] = recorded
                if self._judge is not None and self._judge.stalls:  # for the goodput: node 0's clock, as its attempts'
                    self.final["stalls"] = {self.plan.node_rank: [list(span) for span in self._judge.stalls]}
                if self.stragglers is not None:
                    self.final.update(self.stragglers.closing(store, bool(self.final.get("done"))))
                if self.stacks is not None and self.stacks.teardown is not None and store.check([self.prefix + "abort"]):
                    self.teardown_lines = self.stacks.teardown_summary(self._sealed(store), COLLECT_S)
                    store.set(self._collected_key, "1")
            elif self.stacks is not None and self.stacks.teardown is not None and store.check([self.prefix + "abort"]):
                # Until node 0 has read this node's stacks: a launcher that kills the whole step
                # when one task exits (srun --kill-on-bad-exit) would cut node 0 short.
                deadline = time.monotonic() + LINGER_S + COLLECT_S
                while time.monotonic() < deadline and not store.check([self._collected_key]):
                    time.sleep(POLL_S / 5)
        except Exception:  # noqa: BLE001 - the store's host may have exited first
            pass

    @property
    def _collected_key(self) -> str:
        return self.prefix + "stacks/teardown/collected"

    def _read_final(self, store) -> dict[str, dict[int, object]]:  # type: ignore[no-untyped-def]
        """Two requests whatever N (every counter, every start-up time); a node never beat: the others' checked one by one."""
        there = range(self.plan.nnodes) if store.check(self._beats) else [n for n, key in enumerate(self._beats) if store.check([key])]
        values = dict(zip(there, store.multi_get([self._beats[n] for n in there]))) if there else {}
        starts = [f"{self.prefix}start/{n}" for n in range(self.plan.nnodes)]
        seconds = {n: float(v) for n, v in enumerate(store.multi_get(starts))} if store.check(starts) else {}
        return {"done": {n: v == DONE for n, v in values.items()}, "start_s": seconds, "replaced": {n: True for n, v in values.items() if v == REPLACED}}

    def _ack(self, store) -> None:  # type: ignore[no-untyped-def]
        if not self._acked:
            self._acked = True
            store.add(self.prefix + "ack", 1)

    def _linger(self, store) -> None:  # type: ignore[no-untyped-def]
        """Node 0: keep serving until every node read the abort or finished (bounded)."""
        deadline = time.monotonic() + LINGER_S
        while time.monotonic() < deadline:
            aborted = store.check([self.prefix + "abort"])
            if aborted and store.add(self.prefix + "ack", 0) >= self.plan.nnodes:
                return
            # check first: a get of a key never set waits for it, and a node may never have beaten
            if not aborted and store.check(self._beats) and all(v in (DONE, REPLACED) for v in store.multi_get(self._beats)):
                return
            time.sleep(POLL_S / 5)

    def _connect(self):  # type: ignore[no-untyped-def]
        from ..host.network import connect
        from ..storeclient import open_client

        deadline = time.monotonic() + self.connect_timeout_s
        while not self._stop.is_set() and time.monotonic() < deadline:
            if not connect(self.endpoint[0], self.endpoint[1], STORE_TIMEOUT_S)["ok"]:
                time.sleep(POLL_S)  # a plain connect first: torch's client logs a C++ trace for every refusal
                continue
            try:
                return open_client(self.endpoint[0], self.endpoint[1], STORE_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - not up yet; the rendezvous reports a real failure
                time.sleep(POLL_S)
        return None

    def _abort(self, store, reason: str) -> None:  # type: ignore[no-untyped-def]
        self.reason = reason
        self._stop.set()
        try:
            self._ack(store)
        except Exception:  # noqa: BLE001 - the store may be the thing that failed
            pass
        self.on_abort(reason)

    def _authenticated(self, store) -> bool:  # type: ignore[no-untyped-def]
        """Whether the watched store is this run's (node 0's record there checks); said in one
        line if not: a store someone else serves at the job's port is never acted on."""
        from dataclasses import replace

        from .authority import AuthError, verify

        bound = replace(self.plan, master_addr=self.endpoint[0], master_port=self.endpoint[1])
        for attempt in range(AUTH_TRIES):
            try:
                self._seal = verify(store, bound, self.connect_timeout_s)
                return True
            except AuthError as exc:
                # A tool's failure is tried again: unmunge started from this thread once failed to
                # exec on the cluster ("Bad address", an environment moved by another thread: now
                # started with its own, host.processes.own_environment); a busy munged may be slow.
                if attempt + 1 < AUTH_TRIES and not self._stop.wait(POLL_S * (attempt + 1)):
                    continue
                print(f"hpctorch: node {self.plan.node_rank}'s workers run unwatched: {exc.line()}", file=sys.stderr, flush=True)
        return False

    def _run(self) -> None:
        store = self._connect()
        if store is None or not self._authenticated(store):
            return
        self._store = store
        self.connected.set()
        if self.startup_s is not None:
            try:
                store.set(f"{self.prefix}start/{self.plan.node_rank}", f"{self.startup_s:.3f}")  # once per node
            except Exception:  # noqa: BLE001 - only the closing summary misses it
                pass
        judge = self._judge = Judge(self.plan, self.stall, self.all_up, self.spares) if self.plan.is_master else None
        if self.stragglers is not None:
            try:
                self.stragglers.announce(store)  # before this node's first beat
                self._straggle.start()
            except Exception:  # noqa: BLE001 - the loop below reports a store that is gone
                pass
        if self.stall is not None:
            try:
                store.add(f"{self.prefix}out/{self.plan.node_rank}", 0)  # exists before this node's first beat
            except Exception:  # noqa: BLE001 - the loop below reports a store that is gone
                pass
            self._side.start()
        last_ok = time.monotonic()
        master_finished = False
        polls = 0
        while not self._stop.wait(POLL_S):
            now = time.monotonic()
            try:
                if polls % BEAT_EVERY == 0:
                    self.requests += 1
                    store.add(self._beat_key(), 1)
                polls += 1
                self.requests += 1
                state = store.add(self._state_key, 0)
                reason = self._sealed_abort(store) if state >= ABORTED else None
                if reason is not None:
                    if not self._stop.is_set():
                        self._abort(store, reason)
                    return
                master_finished = state == FINISHED
                if judge is not None:
                    self.requests += 1
                    sealed = self._sealed(store)
                    reason = judge.verdict(store, self._beats, now, sealed) or judge.stalled(store, self._outs, now, sealed)
                    if reason:
                        self._set_abort(store, reason)
                        self._abort(store, reason)
                        return
                last_ok = now
            except Exception:  # noqa: BLE001 - the master's store went away
                if self._stop.is_set() or master_finished:
                    return  # node 0's workers all succeeded and its agent left: ours finish too
                if now - last_ok > UNREACHABLE_AFTER_S:
                    self._abort(store, f"the master's store at {self.endpoint[0]}:{self.endpoint[1]} is gone (node 0 failed?)")
                    return

    def _watch_output_loop(self) -> None:
        while not self._stop.wait(POLL_S):
            store = self._store
            if store is None:
                return
            try:
                self._watch_output(store)
            except Exception:  # noqa: BLE001 - the beating thread reports a store that is gone
                if self._stop.is_set():
                    return

    def _straggle_loop(self) -> None:
        assert self.stragglers is not None
        while not self._stop.wait(self.stragglers.settings.publish_s):
            store = self._store
            if store is None:
                return
            try:
                self.stragglers.step(store, time.monotonic())
            except Exception:  # noqa: BLE001 - the beating thread reports a store that is gone
                if self._stop.is_set():
                    return

    def _watch_output(self, store) -> None:  # type: ignore[no-untyped-def]
        """One request (``want``), plus one when this node's output grew; a dump when asked."""
        assert self.stall is not None
        size = self.stall.output_size()
        if size != self._output:
            self._output = size
            self.requests += 1
            store.add(f"{self.prefix}out/{self.plan.node_rank}", 1)
        self.requests += 1
        wanted = store.add(stall_dump_keys(self.plan.run_id)[1], 0)
        if wanted <= self._wanted or self.stacks is None:
            return
        self._wanted = wanted
        stall = self._asked(store)
        if stall is None:
            return  # the counter moved, and node 0 asked for no new dump: someone else's request
        self._answered = stall
        from ..stacks.job import publish

        own = self.stacks.take(f"stall{stall}")
        if not self.plan.is_master:
            publish(self._sealed(store), f"{self.stacks.prefix}stall{stall}/", [self.plan.node_rank], own[0])
            return
        title = f"no rank wrote any output for {self.stall.seconds:.0f} s (--stall-timeout); the job goes on; stacks"
        print("\n".join(self.stacks.lines(self._sealed(store), f"stall{stall}", own, COLLECT_S, title)), file=sys.stderr, flush=True)

    def _asked(self, store) -> int | None:  # type: ignore[no-untyped-def]
        """The stall node 0 last asked a dump for (its sealed number), when this node has not answered it yet."""
        key = stall_dump_keys(self.plan.run_id)[0]
        self.requests += 1
        if not store.check([key]):
            return None
        self.requests += 1
        opened = self._sealed(store).opened([key])[0]
        return int(opened) if opened is not None and opened.isdigit() and int(opened) > self._answered else None


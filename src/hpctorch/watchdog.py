"""Whole-job teardown for per-node mode, through the store every agent already shares.

torch's static rendezvous serves a TCPStore on the master (multi-tenant), and each
node's agent is its client. The watchdog is one more client per node, under the key
prefix ``hpctorch/<run id>/``:
- ``abort``: set by the agent whose workers failed, with a one-line summary; every
  other agent sees it within ``POLL_S`` and stops its workers through the torch
  agent's own SIGTERM handling.
- ``beat/<node>``: a counter each watchdog increments every ``POLL_S``; a node whose
  counter stops moving for ``SILENT_AFTER_S`` (frozen, or its link down) is named and
  the job is aborted. Counters are compared against the local clock only, so clock
  skew between nodes does not matter.
- ``done/<node>``: set when a node's workers all succeeded; such a node is not silent.
"""

from __future__ import annotations

import datetime
import os
import signal
import threading
import time

from .plan import Plan

POLL_S = 0.5
SILENT_AFTER_S = 10.0
UNREACHABLE_AFTER_S = 3.0
STORE_TIMEOUT_S = 2


class JobWatchdog:
    def __init__(self, plan: Plan, connect_timeout_s: float) -> None:
        self.plan = plan
        self.prefix = f"hpctorch/{plan.run_id}/"
        self.connect_timeout_s = connect_timeout_s
        self.reason: str | None = None
        self._store = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hpctorch-watchdog", daemon=True)

    def start(self) -> "JobWatchdog":
        if self.plan.nnodes > 1:
            self._thread.start()
        return self

    def report_failure(self, summary: str) -> None:
        """Tell every node that this one failed (best effort: the store may be gone)."""
        self._finish(self.prefix + "abort", summary)

    def finished(self) -> None:
        self._finish(f"{self.prefix}done/{self.plan.node_rank}", "1")

    def close(self) -> None:
        """Stop watching without telling anyone (the abort is already in the store)."""
        self._finish(None, "")

    def _finish(self, key: str | None, value: str) -> None:
        # Join before the last write and before this process exits: a daemon thread
        # left inside a C++ store call at interpreter shutdown aborts the process.
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=STORE_TIMEOUT_S + POLL_S + 1)
        store, self._store = self._store, None
        if store is not None and key is not None:
            try:
                store.set(key, value)
            except Exception:  # noqa: BLE001 - the store's host may have exited first
                pass

    def _connect(self):  # type: ignore[no-untyped-def]
        from torch.distributed import TCPStore

        deadline = time.monotonic() + self.connect_timeout_s
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                return TCPStore(self.plan.master_addr, self.plan.master_port, is_master=False,
                                timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S), wait_for_workers=False)
            except Exception:  # noqa: BLE001 - not up yet; the rendezvous reports a real failure
                time.sleep(POLL_S)
        return None

    def _abort(self, reason: str) -> None:
        self.reason = reason
        self._stop.set()
        os.kill(os.getpid(), signal.SIGTERM)  # the torch agent stops its workers on SIGTERM

    def _run(self) -> None:
        store = self._connect()
        if store is None:
            return
        self._store = store
        me = self.plan.node_rank
        others = [n for n in range(self.plan.nnodes) if n != me]
        last_seen: dict[int, tuple[int, float]] = {}
        done: set[int] = set()
        last_ok = time.monotonic()
        while not self._stop.wait(POLL_S):
            now = time.monotonic()
            try:
                store.add(f"{self.prefix}beat/{me}", 1)
                if store.check([self.prefix + "abort"]):
                    if not self._stop.is_set():
                        self._abort(store.get(self.prefix + "abort").decode())
                    return
                for node in others:
                    if node in done:
                        continue
                    if store.check([f"{self.prefix}done/{node}"]):
                        done.add(node)
                        continue
                    beats = store.add(f"{self.prefix}beat/{node}", 0)
                    if beats == 0:
                        continue  # not started yet: the rendezvous timeout covers that
                    count, since = last_seen.get(node, (-1, now))
                    if beats != count:
                        last_seen[node] = (beats, now)
                    elif now - since > SILENT_AFTER_S:
                        host = self.plan.nodes[node] if self.plan.nodes else f"node {node}"
                        reason = f"node {node} ({host}) went silent: no heartbeat for {SILENT_AFTER_S:.0f} s"
                        store.set(self.prefix + "abort", reason)
                        self._abort(reason)
                        return
                last_ok = now
            except Exception:  # noqa: BLE001 - the master's store went away
                if len(done) == len(others) or self._stop.is_set():
                    return
                if now - last_ok > UNREACHABLE_AFTER_S:
                    self._abort(f"the master's store at {self.plan.master_addr}:{self.plan.master_port} is gone (node 0 failed?)")
                    return

"""``--stall-timeout`` on one node whose workers hpctorch starts itself (no store, no helper).

The same rule as node 0's judge across nodes (``judge.Judge.stalled``): once the workers have
written something, when their captured output has not grown for the timeout, the workers' stacks are printed once for that
stall (again only after output resumed and stopped again), or, with ``--stall-action kill``,
``poll()`` returns the reason (and ``on_kill(reason)`` is called) and the job is stopped with the
stacks at teardown: by the supervisor, or under torch's agent (one node has no store to watch).
Sizing the logs and taking stacks run in this thread of its own, never in the supervisor's wait.
"""

from __future__ import annotations

import sys
import threading
import time

from collections.abc import Callable

from .watchdog import POLL_S, StallWatch


class AloneStall:
    def __init__(self, watch: StallWatch, stacks, on_kill: Callable[[str], None] = lambda _reason: None) -> None:  # type: ignore[no-untyped-def]
        """``stacks``: this node's ``stacks.job.NodeStacks``."""
        self.watch = watch
        self.stacks = stacks
        self.on_kill = on_kill
        self.reason: str | None = None
        self.dumps = 0
        self.stalls: list[list[float | None]] = []
        """Each stall: [since the last output, until output resumed (None: not yet)], monotonic."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hpctorch-stall-watch", daemon=True)

    def start(self) -> "AloneStall":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def poll(self) -> str | None:
        """The reason to stop the job (``--stall-action kill`` after a stall), else None."""
        return self.reason

    def _run(self) -> None:
        size, since, dumped = 0, 0.0, False
        while not self._stop.wait(POLL_S):
            now, grown = time.monotonic(), self.watch.output_size()
            if grown != size:
                if dumped and self.stalls:
                    self.stalls[-1][1] = now  # output resumed: that stall is over
                size, since, dumped = grown, now, False
                continue
            if not size or dumped or now - since < self.watch.seconds:
                continue  # nothing written yet: the start (imports, rendezvous) has timeouts of its own
            dumped = True
            self.stalls.append([since, None])
            reason = f"no rank wrote any output for {self.watch.seconds:.0f} s (--stall-timeout)"
            if self.watch.kill:
                self.reason = reason
                self.on_kill(reason)
                return
            self.dumps += 1
            own = self.stacks.take(f"stall{self.dumps}")
            title = f"{reason}; the job goes on; stacks"
            lines = self.stacks.lines(None, f"stall{self.dumps}", own, 0.0, title)
            if lines and not self._stop.is_set():
                print("\n".join(lines), file=sys.stderr, flush=True)

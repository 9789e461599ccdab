"""Benchmark 8: ranks waiting for rank 0's store to listen (``storewait``), 16 to 4,096 of them.

The real ``storewait.wait``, one per simulated rank, as threads in a few client processes,
against a loopback port where nothing listens for a while, then a listening socket (all the
wait sees of rank 0's store: the kernel completes the handshake). Per rank count:
- refused connections per second at "rank 0" once every waiter's pause reached its cap,
  beside the design's bound (``PROBES_PER_S``, or each rank every ``CAP_MAX_S``);
- time from the listen until the median and the last waiter returned (torch's own client,
  refused, sleeps 0.25-0.75 s and then longer before it tries again).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import threading
import time

from hpctorch.host.network import free_port
from hpctorch.start import storewait

from .common import PYTHON, ROOT, clean_env, save, table

PROCESSES = 8
SETTLE_S = 3.0
"""Long enough for every pause to reach its cap (0.01 s x 1.5 per try, capped at 2 s)."""
WINDOW_S = 4.0
NOTES = (
    "All waiters share this machine's 2 cores, as Python threads in 8 processes: at 4,096 they could not make the "
    "bound's rate (the refusals a second are what they managed), and their release after the listen (each waiter's "
    "next try, then one Python thread accepting every connection) waits on the same CPU; real ranks wait on nodes of "
    "their own, so the 16 and 256 rows are the latency a rank sees.",
)


def client(count: int, world_size: int, port: int) -> None:
    """``count`` waiters; prints every refusal's and return's time as one JSON line."""
    refusals: list[list[float]] = [[] for _ in range(count)]
    returned: list[float] = [0.0] * count

    def waiter(index: int) -> None:
        def connect(target: tuple, timeout_s: float) -> bool:
            if storewait._connect(target, timeout_s):
                return True
            refusals[index].append(time.time())
            return False

        storewait.wait("127.0.0.1", port, world_size, 120, connect=connect)
        returned[index] = time.time()

    threads = [threading.Thread(target=waiter, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    print("ready", flush=True)
    for thread in threads:
        thread.join(timeout=180)
    print(json.dumps({"refusals": [t for times in refusals for t in times], "returned": returned}), flush=True)


def _accept_forever(server: socket.socket) -> None:
    while True:
        try:
            connection, _ = server.accept()
        except OSError:
            return
        connection.close()


def run(ranks: int) -> dict[str, float]:
    print(f"store_wait: {ranks} waiting ranks", file=sys.stderr, flush=True)
    port = free_port("127.0.0.1")
    processes = min(PROCESSES, ranks)
    counts = [ranks * (p + 1) // processes - ranks * p // processes for p in range(processes)]
    children = [subprocess.Popen([PYTHON, "-m", "benchmarks.store_wait", "--client", str(n), str(ranks), str(port)],
                                 cwd=ROOT, env=clean_env(), stdout=subprocess.PIPE, text=True) for n in counts]
    server = socket.socket()
    try:
        for child in children:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        time.sleep(SETTLE_S)
        window_start = time.time()
        time.sleep(WINDOW_S)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen(4096)
        listened = time.time()
        threading.Thread(target=_accept_forever, args=(server,), daemon=True).start()
        results = [json.loads(child.communicate(timeout=180)[0].strip().splitlines()[-1]) for child in children]
    finally:
        server.close()
        for child in children:
            if child.poll() is None:
                child.kill()
    refused = sum(1 for r in results for t in r["refusals"] if window_start <= t < listened)
    released = sorted(t - listened for r in results for t in r["returned"])
    return {
        "ranks": ranks,
        "cap_s": storewait.interval_cap(ranks),
        "refused_per_s": refused / (listened - window_start),
        "bound_per_s": ranks / storewait.interval_cap(ranks),
        "released_median_s": statistics.median(released),
        "released_last_s": released[-1],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, results not saved")
    parser.add_argument("--client", nargs=3, type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 256, 4096], help="waiting ranks")
    args = parser.parse_args(argv)
    if args.client:
        client(*args.client)
        return
    rows = [run(n) for n in ((4,) if args.smoke else args.sizes)]
    print(table(["waiting ranks", "pause cap (s)", "refused/s at rank 0", "bound/s", "released after listen: median s", "last s"],
                [[r["ranks"], f"{r['cap_s']:.2f}", f"{r['refused_per_s']:.0f}", f"{r['bound_per_s']:.0f}",
                  f"{r['released_median_s']:.3f}", f"{r['released_last_s']:.3f}"] for r in rows]))
    if not args.smoke:
        save("store_wait", {"processes": PROCESSES, "settle_s": SETTLE_S, "window_s": WINDOW_S, "rows": rows, "notes": NOTES})


if __name__ == "__main__":
    main()

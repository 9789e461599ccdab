"""10. How ``--stage-env`` spreads node 0's pack: 16 -> 4,096 simulated nodes on this machine run
the real tree (``stage.spread.take_part``: each node finds its parent's address in torch's
TCPStore through hpctorch's own client, connects, keeps the bytes as they arrive and sends them
to each of its k children from a thread of its own) over loopback; each node checks the SHA-256
of what it got. Node 0 reads
the pack once; the time is from the go to the last node's last byte, against the tree's depth
log_k(N).

The simulated nodes are threads in 8 processes sharing this machine's 2 cores, so every byte of
every node crosses the same CPUs: the time grows with N here for that reason alone (N copies of
the payload through 2 cores), where on a cluster each node has its own link and CPUs. What the
benchmark shows is the shape: one read of the shared copy, k sends per node, the depth, every
node's bytes intact, and the store requests per node.

Then one slow node (the issue's case): 64 MiB over 4 nodes, k = 2 (node 0 -> 1, 2; node 1 -> 3),
node 1 extracting at 5 MiB/s, a 3 s deadline (``HPCTORCH_STAGE_TIMEOUT_S``): when its sibling,
its child and node 1 itself are done, against the same tree with no slow node.

    python -m benchmarks.stage_spread [--nodes 16,64,256,1024,4096] [--mib 4] [--fanout 4]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import threading
import time

from .common import PYTHON, isolated, save, table

PROCESSES = 8
CHUNK = 256 << 10
PREFIX = "bench/stage/"


def _payload(mib: float) -> bytes:
    block = hashlib.sha256(b"hpctorch").digest() * 32  # 1 KiB, repeated: the content does not matter, its digest is checked
    return (block * int(mib * 1024))[: int(mib * 2**20)]


def client(first: int, last: int, nnodes: int, port: int, size: int, digest: str, fanout: int) -> None:
    """Nodes first..last-1 as threads: each connects, says it is ready, waits for the go, takes part."""
    from hpctorch import storeclient
    from hpctorch.stage import spread

    threading.stack_size(512 << 10)
    results: dict[int, dict] = {}

    def node(me: int) -> None:
        store = storeclient.connect("127.0.0.1", port, 600)
        store.add(PREFIX + "ready", 1)
        store.wait([PREFIX + "go"])
        hashed, count = hashlib.sha256(), 0

        def consume(chunks) -> None:  # type: ignore[no-untyped-def]
            nonlocal count
            for chunk in chunks:
                hashed.update(chunk)
                count += len(chunk)

        try:
            spread.take_part(store, PREFIX, me, nnodes, "127.0.0.1", "token", size, consume, None, fanout, time.monotonic() + 600,
                             accept_s=120, idle_s=300).close()
            results[me] = {"done": time.time(), "ok": count == size and hashed.hexdigest() == digest}
        except spread.SpreadError as exc:
            results[me] = {"done": time.time(), "ok": False, "error": str(exc)}

    threads = [threading.Thread(target=node, args=(n,)) for n in range(first, last)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps(results), flush=True)


def simulate(nnodes: int, mib: float, fanout: int) -> dict:
    import datetime

    from torch.distributed import TCPStore

    from hpctorch.stage import spread

    payload = _payload(mib)
    digest = hashlib.sha256(payload).hexdigest()
    server = TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=600), wait_for_workers=False, multi_tenant=True)
    bounds = [1 + (nnodes - 1) * p // PROCESSES for p in range(PROCESSES + 1)]
    children = [subprocess.Popen([PYTHON, "-m", "benchmarks.stage_spread", "--client", str(bounds[p]), str(bounds[p + 1]), str(nnodes),
                                  str(server.port), str(len(payload)), digest, str(fanout)], stdout=subprocess.PIPE, text=True)
                for p in range(PROCESSES) if bounds[p] < bounds[p + 1]]
    deadline = time.monotonic() + 600
    while server.add(PREFIX + "ready", 0) < nnodes - 1:
        if time.monotonic() > deadline:
            raise SystemExit("the simulated nodes did not connect")
        time.sleep(0.05)
    sent = 0

    def source():  # type: ignore[no-untyped-def]
        nonlocal sent
        for at in range(0, len(payload), CHUNK):
            sent += len(payload[at:at + CHUNK])
            yield payload[at:at + CHUNK]

    started = time.time()
    server.set(PREFIX + "go", "1")
    spread.take_part(server, PREFIX, 0, nnodes, "127.0.0.1", "token", len(payload), None, source(), fanout, time.monotonic() + 600,
                     accept_s=120, idle_s=300).close()
    results: dict[int, dict] = {}
    for child in children:
        out, _ = child.communicate(timeout=900)
        results.update({int(k): v for k, v in json.loads(out.strip().splitlines()[-1]).items()})
    bad = sorted(n for n, r in results.items() if not r["ok"])
    return {"nodes": nnodes, "fanout": fanout, "depth": spread.depth_of(nnodes, fanout), "mib": mib,
            "seconds": round(max(r["done"] for r in results.values()) - started, 3), "intact": len(results) - len(bad),
            "failed": bad[:5], "read_from_shared_mib": round(sent / 2**20, 3),
            "node0_sent_mib": round(min(fanout, nnodes - 1) * len(payload) / 2**20, 3),
            "store_requests_per_node": "3 (set own address if it has children; wait for and get the parent's)"}


def slow_node(mib: float = 64.0, rate_mib_s: float | None = 5.0, deadline_s: float = 3.0) -> dict:
    """4 nodes as threads, k = 2; node 1 takes ``rate_mib_s`` (None: as fast as it can). When
    each node's part ended, from the go, and how it ended."""
    import datetime
    import tempfile

    from torch.distributed import TCPStore

    from hpctorch.stage import spread

    payload = _payload(mib)
    server = TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=60), wait_for_workers=False, multi_tenant=True)
    ended: dict[int, float] = {}
    outcome: dict[int, str] = {}
    started = time.monotonic()
    deadline = started + deadline_s

    def node(me: int) -> None:
        store = server if me == 0 else TCPStore("127.0.0.1", server.port, None, False, datetime.timedelta(seconds=60))

        def consume(chunks) -> None:  # type: ignore[no-untyped-def]
            for chunk in chunks:
                if me == 1 and rate_mib_s:
                    time.sleep(len(chunk) / 2**20 / rate_mib_s)

        source = [payload[at:at + CHUNK] for at in range(0, len(payload), CHUNK)] if me == 0 else None
        try:
            spread.take_part(store, PREFIX + "slow/", me, 4, "127.0.0.1", "token", len(payload), None if me == 0 else consume, source, 2,
                             deadline, spool_dir=spool).close()
            outcome[me] = "all bytes"
        except spread.SpreadError as exc:
            outcome[me] = str(exc)
        ended[me] = time.monotonic() - started

    with tempfile.TemporaryDirectory() as spool:
        threads = [threading.Thread(target=node, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return {"slow_mib_s": rate_mib_s, "mib": mib, "deadline_s": deadline_s, "ended": ended, "outcome": outcome}


SLOW_HEADER = ["node 1 extracts at", "node 2 (its sibling) done s", "node 3 (its child) done s", "node 1 done s", "node 1 ended with"]


def slow_cells(row: dict) -> list[object]:
    ended = {int(node): at for node, at in row["ended"].items()}  # keys are text once saved as JSON
    outcome = {int(node): said for node, said in row["outcome"].items()}
    return [f"{row['slow_mib_s']:g} MiB/s" if row["slow_mib_s"] else "full speed", f"{ended[2]:.2f}", f"{ended[3]:.2f}", f"{ended[1]:.2f}",
            outcome[1]]


HEADER = ["nodes", "depth (log_k N)", "payload MiB", "time s", "all nodes' bytes GiB/s", "nodes intact", "read from the shared copy (MiB)",
          "node 0 sends (MiB)"]


def cells(row: dict) -> list[object]:
    # All nodes' bytes per second: flat when this machine's cores, not the tree, set the pace.
    return [row["nodes"], row["depth"], f"{row['mib']:g}", f"{row['seconds']:.2f}", f"{row['nodes'] * row['mib'] / 1024 / row['seconds']:.2f}",
            f"{row['intact'] + 1} of {row['nodes']}", f"{row['read_from_shared_mib']:g}", f"{row['node0_sent_mib']:g}"]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        first, last, nnodes, port, size = (int(v) for v in sys.argv[2:7])
        client(first, last, nnodes, port, size, sys.argv[7], int(sys.argv[8]))
        return
    status = isolated("benchmarks.stage_spread", sys.argv[1:])  # as benchmark 7: torch's store looks up every peer's name
    if status is not None:
        raise SystemExit(status)
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", default="16,64,256,1024,4096")
    parser.add_argument("--mib", type=float, default=4.0)
    parser.add_argument("--fanout", type=int, default=4)
    parser.add_argument("--smoke", action="store_true", help="16 nodes, 1 MiB, results not saved")
    args = parser.parse_args()
    sizes = [16] if args.smoke else [int(n) for n in args.nodes.split(",")]
    rows = [simulate(n, 1.0 if args.smoke else args.mib, args.fanout) for n in sizes]
    for row in rows:
        if row["failed"]:
            raise SystemExit(f"{row['nodes']} nodes: some did not get the payload intact: {row['failed']}")
    print(table(HEADER, [cells(r) for r in rows]))
    slow = [] if args.smoke else [slow_node(rate_mib_s=None), slow_node()]
    if slow:
        print(table(SLOW_HEADER, [slow_cells(r) for r in slow]))
        print(f"saved {save('stage_spread', {'rows': rows, 'slow_node': slow, 'processes': PROCESSES, 'chunk_kib': CHUNK >> 10})}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()

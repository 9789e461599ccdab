"""Benchmark 11: what authenticating node 0's store costs (``guard.authority``), per mechanism.

The real ``authority.publish`` (node 0, once per store it serves) and ``authority.verify``
(every node, once per store it joins) against a real TCPStore on loopback, and the seal every
record carries. Per mechanism found here (MUNGE where munged answers, the 0600 secret file
always):
- node 0's publish: making the run's secret, probing munged, the credential or the file;
- a node's verify: the store requests it makes (the scale rule: O(1) per node, whatever N, so
  node 0's store answers 2 requests per node per job for it) and its time;
- sealing and opening one 200-byte record (HMAC-SHA256), per record the nodes exchange.
Where a node starts in seconds (benchmark 1), a few milliseconds once per job is the cost.
"""

from __future__ import annotations

import argparse
import datetime
import os
import tempfile
import time
from collections.abc import Sequence

from .common import CountingStore, save, summary, table

RECORD = b"x" * 200


def _plan(port: int, run_id: str):  # type: ignore[no-untyped-def]
    from hpctorch.plan.types import Plan

    return Plan(mode="per-node", scheduler="bench", job_id="1", nodes=("n0", "n1"), node_rank=0, nproc_per_node=(1, 1),
                master_addr="127.0.0.1", master_port=port, rdzv_backend="static", rdzv_timeout=30, run_id=run_id, iface="lo",
                simulated=False, max_restarts=0, workers=(), common_env={})


def measure(mechanism: str, repeats: int) -> dict[str, object]:
    """Node 0's publish and a node's verify, ``repeats`` times each with a fresh run (a fresh secret)."""
    from torch.distributed import TCPStore

    from hpctorch.guard import authority

    if mechanism == "file":
        authority.munge_works = lambda: False  # type: ignore[assignment] # the fallback, as on a site without munged
    server = TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=30), wait_for_workers=False, multi_tenant=True)
    client = CountingStore(TCPStore("127.0.0.1", server.port, None, False, datetime.timedelta(seconds=30)))
    publish_ms, verify_ms, requests = [], [], []
    for index in range(repeats):
        plan = _plan(server.port, f"bench-auth-{mechanism}-{os.getpid()}-{index}")
        started = time.perf_counter()
        seal = authority.publish(server, plan)
        publish_ms.append((time.perf_counter() - started) * 1e3)
        assert seal.mechanism == mechanism, seal.mechanism
        before = client.requests
        started = time.perf_counter()
        authority.verify(client, plan, 30)
        verify_ms.append((time.perf_counter() - started) * 1e3)
        requests.append(client.requests - before)
    rounds = 10_000
    started = time.perf_counter()
    for _ in range(rounds):
        seal.open("hpctorch/r/key", seal.seal("hpctorch/r/key", RECORD))
    record_us = (time.perf_counter() - started) / rounds * 1e6
    return {"mechanism": mechanism, "publish_ms": publish_ms, "verify_ms": verify_ms, "verify_requests": max(requests),
            "record_us": record_us}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    repeats = 2 if args.smoke else args.repeats
    from hpctorch.guard import authority

    mechanisms = (["munge"] if authority.munge_works() else []) + ["file"]  # file last: it turns munge off in this process
    with tempfile.TemporaryDirectory(prefix="hpctorch-bench-auth-") as state:
        os.environ["XDG_STATE_HOME"] = state  # the run's secrets in a folder of the benchmark's, not the user's
        rows = [measure(mechanism, repeats) for mechanism in mechanisms]
    print(table(["mechanism", "node 0's publish: median ms", "a node's verify: median ms", "min / max ms",
                 "store requests per node", "seal + open a record (us)"],
                [[r["mechanism"], f"{summary(r['publish_ms'])['median']:.2f}", f"{summary(r['verify_ms'])['median']:.2f}",  # type: ignore[arg-type]
                  f"{summary(r['verify_ms'])['min']:.2f} / {summary(r['verify_ms'])['max']:.2f}",  # type: ignore[arg-type]
                  r["verify_requests"], f"{r['record_us']:.1f}"] for r in rows]))
    if not mechanisms[0] == "munge":
        print("\nmunged does not answer here: the MUNGE row is missing (Slurm sites run it on every node).")
    if not args.smoke:
        save("auth_cost", {"rows": rows, "repeats": repeats})


if __name__ == "__main__":
    main()

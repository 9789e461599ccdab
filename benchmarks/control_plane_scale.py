"""Benchmark 7: hpctorch's own control plane at 16 to 4,096 nodes, on one real TCPStore,
and its shared-file channel on one real folder.

The real ``watchdog.JobWatchdog`` and ``agreement.check`` (not copies), one per simulated
node, as threads in a few client processes; no torch workers. Per node count:
- store requests per second, in total and per node, while every node idles;
- false "went silent" verdicts during that idle time (should be none);
- time from one node's ``report_failure`` until every node's watchdog has acted on it;
- time until every node has passed the agreement check.
The shared-file channel (``sharedfiles.BeatingFiles``, which the agreement and the doctor
use through the submit directory): every simulated node publishes and reads once a poll (the
real interval is 1 s, so a poll is a second); file-system calls per node and at node 0.
``--only files`` runs this part alone and keeps the saved store rows.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from hpctorch.host.network import free_port
from hpctorch.plan.types import Plan

from .common import PYTHON, ROOT, CountingStore, clean_env, isolated, save, table

PROCESSES = 8
"""Client processes per table row (each imports torch: about 3 s of CPU here); --smoke uses 2."""
NOTES = (
    "Run in a network namespace of its own (loopback only) when root: this VM's resolver never answers, and "
    "torch's TCPStore looks up the peer name of every connection (5 s per try); without a route the lookup "
    "fails at once, as it answers at once on a cluster with working DNS.",
    "All simulated nodes share this machine's 2 cores: the agreement's wall time here is mostly the Python CPU "
    "of N nodes run one after another (the 'agreement CPU' column, all client processes together), which "
    "real nodes spend in parallel on their own CPUs; the store's own load is the requests/s column.",
    "Each record holds the node list as a Slurm hostlist (or a digest past 200 characters) and the processes "
    "per node run-length encoded: a record no longer grows with N (it held the whole list: ~40 KB per node at "
    "4,096, 160 MB for node 0 to read; 2,048 nodes took 43.6 s to agree, 4,096 did not finish).",
)
RUN_ID = "bench"


@functools.lru_cache(maxsize=2)
def _names(nnodes: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """One node list for all simulated nodes of a process (each real node builds its own once)."""
    return tuple(f"nid{n:05d}" for n in range(nnodes)), (1,) * nnodes


def node_plan(node: int, nnodes: int, port: int) -> Plan:
    names, counts = _names(nnodes)
    return Plan(
        mode="per-node", scheduler="bench", job_id="1", nodes=names, node_rank=node,
        nproc_per_node=counts, master_addr="127.0.0.1", master_port=port, rdzv_backend="static", rdzv_timeout=120,
        run_id=RUN_ID, iface="lo", simulated=False, max_restarts=0, workers=(), common_env={},
    )


def _store(port: int, master: bool):  # type: ignore[no-untyped-def]
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", port, is_master=master, timeout=datetime.timedelta(seconds=120), wait_for_workers=False,
                    multi_tenant=True)


def client(first: int, last: int, nnodes: int, port: int, agree_port: int, idle_s: float) -> None:
    """One client process: simulated nodes ``first``..``last - 1``; prints its findings as JSON."""
    from hpctorch.guard import agreement
    from hpctorch.guard.watchdog import JobWatchdog

    control = _store(port, False)
    # Agreement first: every node checks its plan against the others' (node 0 serves the store).
    agreed: dict[int, float] = {}

    def agree(node: int) -> None:
        store = agreement.check(node_plan(node, nnodes, agree_port), 120)
        agreed[node] = time.time()
        if store is not None:
            holder.append(store)  # node 0 serves until everyone is through

    holder: list = []
    # Each real node compresses its node list once, on its own CPU, in parallel with every other
    # node; here all simulated nodes of a process would do it at once on 2 shared cores.
    agreement.record(node_plan(first, nnodes, agree_port))
    control.add("bench/agree-ready", 1)
    control.wait(["bench/agree-go"])
    cpu = sum(os.times()[:2])
    threads = [threading.Thread(target=agree, args=(n,)) for n in range(first, last)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    agree_cpu = sum(os.times()[:2]) - cpu
    control.add("bench/agreed", 1)
    control.wait(["bench/all-agreed"])
    holder.clear()

    acted: dict[int, tuple[float, str]] = {}
    watchdogs = {}
    for node in range(first, last):
        watchdogs[node] = JobWatchdog(node_plan(node, nnodes, port), 120,
                                      on_abort=lambda reason, n=node: acted.setdefault(n, (time.time(), reason)))
        watchdogs[node].start()
    control.add("bench/ready", 1)
    control.wait(["bench/idle-start"])
    before = {n: w.requests for n, w in watchdogs.items()}
    started = time.time()
    time.sleep(idle_s)
    after = {n: w.requests for n, w in watchdogs.items()}
    window = time.time() - started
    false_alarms = len(acted)
    control.add("bench/idled", 1)
    control.wait(["bench/fail"])
    failing = nnodes - 1
    if failing in watchdogs:
        watchdogs[failing].report_failure("benchmark: a worker on the last node failed")
    deadline = time.monotonic() + 60
    while len(acted) < len(watchdogs) - (failing in watchdogs) and time.monotonic() < deadline:
        time.sleep(0.05)
    for node, watchdog in watchdogs.items():
        if node != failing:
            watchdog.close()  # node 0 lingers until every node acknowledged
    print(json.dumps({
        "requests": sum(after[n] - before[n] for n in watchdogs), "window": window, "false_alarms": false_alarms,
        "acted": [t for t, _ in acted.values()], "missing": len(watchdogs) - (failing in watchdogs) - len(acted),
        "agreed": max(agreed.values()), "agree_cpu": agree_cpu,
    }), flush=True)


def run(nnodes: int, idle_s: float) -> dict[str, float]:
    print(f"control_plane_scale: {nnodes} nodes", file=sys.stderr, flush=True)
    port, agree_port = free_port(), free_port()
    control = _store(port, True)
    processes = min(PROCESSES, nnodes)
    bounds = [nnodes * p // processes for p in range(processes + 1)]
    children = [subprocess.Popen([PYTHON, "-m", "benchmarks.control_plane_scale", "--client", str(bounds[p]), str(bounds[p + 1]),
                                  str(nnodes), str(port), str(agree_port), str(idle_s)],
                                 cwd=ROOT, env=clean_env(), stdout=subprocess.PIPE, text=True) for p in range(processes)]
    with _reaped(children):
        while int(control.add("bench/agree-ready", 0)) < processes:
            time.sleep(0.05)
        agree_start = time.time()
        control.set("bench/agree-go", "1")
        while int(control.add("bench/agreed", 0)) < processes:
            time.sleep(0.05)
        # Node 0's record, by which every watchdog authenticates the store: once the agreement's
        # node 0 (another process, another secret for the run) is done with the run's secret file.
        from hpctorch.guard import authority

        authority.publish(control, node_plan(0, nnodes, port))
        control.set("bench/all-agreed", "1")
        while int(control.add("bench/ready", 0)) < processes:
            time.sleep(0.05)
        control.set("bench/idle-start", "1")
        while int(control.add("bench/idled", 0)) < processes:
            time.sleep(0.1)
        failed_at = time.time()
        control.set("bench/fail", "1")
        results = _reports(children, 180)
    requests = sum(r["requests"] for r in results)
    window = max(r["window"] for r in results)
    acted = [t for r in results for t in r["acted"]]
    return {
        "nodes": nnodes,
        "requests_per_s": requests / window,
        "per_node_per_s": requests / window / nnodes,
        "false_alarms": sum(r["false_alarms"] for r in results),
        "abort_known_s": max(acted) - failed_at if acted else float("nan"),
        "never_knew": sum(r["missing"] for r in results),
        "agreement_s": max(r["agreed"] for r in results) - agree_start,
        "agreement_cpu_s": sum(r["agree_cpu"] for r in results),
    }


def shared_files(nnodes: int, polls: int = 6) -> dict[str, float]:
    """The real BeatingFiles of ``nnodes`` nodes in one folder (interval 0: every call acts, one
    call a poll); file-system calls per poll, once every node has seen what it reads."""
    import tempfile

    from hpctorch.guard.sharedfiles import BeatingFiles

    with tempfile.TemporaryDirectory(prefix="hpctorch-bench-files-") as base:
        directory = os.path.join(base, ".hpctorch", "bench.agreement")
        files = [BeatingFiles(directory, n, {"host": f"nid{n:05d}"}, interval_s=0) for n in range(nnodes)]
        seen_at = None
        counts: list[list[int]] = []
        for poll in range(polls):
            started = time.perf_counter()
            for node in files:
                node.publish()
            time.sleep(0.02)  # file times move in the kernel's coarse clock ticks
            for node in files:
                node.read_live()
            if seen_at is None and len(files[0].live) == nnodes - 1 and all(0 in f.live for f in files[1:]):
                seen_at = poll + 1
            counts.append([f.operations for f in files])
            poll_s = time.perf_counter() - started
        steady = [after - before for before, after in zip(counts[-2], counts[-1])]
    return {
        "nodes": nnodes,
        "files_per_node_per_poll": max(steady[1:]),
        "files_node0_per_poll": steady[0],
        "files_node0_until_seen": counts[(seen_at or polls) - 1][0],
        "files_all_seen_poll": seen_at or float("nan"),
        "files_old_per_node_per_poll": nnodes + 1,
        "files_poll_s": poll_s,
    }


def _reports(children: list[subprocess.Popen], timeout_s: float) -> list[dict]:
    """Each client process's report: the JSON of its last line."""
    return [json.loads(child.communicate(timeout=timeout_s)[0].strip().splitlines()[-1]) for child in children]


@contextmanager
def _reaped(children: list[subprocess.Popen]) -> Iterator[None]:
    """The client processes of one part, killed if still running when it ends (a part that failed)."""
    try:
        yield
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()


def _as_threads(node, first: int, last: int) -> None:  # type: ignore[no-untyped-def]
    """Simulated nodes ``first``..``last - 1`` of a client process, one thread each."""
    threads = [threading.Thread(target=node, args=(n,)) for n in range(first, last)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _clients(flag: str, nnodes: int, port: int, *extra: str) -> list[subprocess.Popen]:
    """Nodes 1..N-1 spread over up to ``PROCESSES`` client processes of this benchmark (``flag``)."""
    processes = min(PROCESSES, nnodes - 1)
    bounds = [1 + (nnodes - 1) * p // processes for p in range(processes + 1)]
    return [subprocess.Popen([PYTHON, "-m", "benchmarks.control_plane_scale", flag, str(bounds[p]), str(bounds[p + 1]), str(nnodes),
                              str(port), *extra], cwd=ROOT, env=clean_env(), stdout=subprocess.PIPE, text=True) for p in range(processes)]


def _screen_record(node: int) -> dict:
    """What a node's local measures return (measuring is the node's own, in parallel, on its own
    CPUs; here the nodes share 2 cores): a realistic record, one node in 64 slow."""
    slow = node % 64 == 63
    return {"host": f"nid{node:05d}", "figures": {"compute_gflops": 60.0 if slow else 200.0 + node % 7, "memory_gbs": 12.0 + node % 3, "free_gb": {"/tmp": 80.0, "/dev/shm": 25.0}},
            "problems": [], "unmeasured": ["GPUs (none visible)"]}


SCREEN_BUDGET_S = 120.0
"""Generous for the benchmark: simulated nodes publish one after another on 2 shared cores; node
0 stops waiting as soon as every record is in."""


def screen_client(first: int, last: int, nnodes: int, port: int) -> None:
    """Simulated nodes ``first``..``last - 1`` each run the real ``screen.run`` (no ring link: one
    machine); prints the requests each made."""
    from hpctorch.screen import exchange as screen

    counts: dict[int, int] = {}

    def node(rank: int) -> None:
        store = CountingStore(_store(port, False))
        screen.run(node_plan(rank, nnodes, port), store, 0.5, False, "hpctorch/bench/screen/", 120, SCREEN_BUDGET_S,
                   local=lambda _gpus: _screen_record(rank), ring=False)
        counts[rank] = store.requests

    _as_threads(node, first, last)
    print(json.dumps({"requests": counts}), flush=True)


def screen_scale(nnodes: int) -> dict[str, float]:
    """Node 0's real screen (collection and judgement) with ``nnodes - 1`` simulated others."""
    from hpctorch.screen import exchange as screen
    from hpctorch.screen import judge

    print(f"control_plane_scale: screen at {nnodes} nodes", file=sys.stderr, flush=True)
    port = free_port()
    served = CountingStore(_store(port, True))
    children = _clients("--screen-client", nnodes, port)
    with _reaped(children):
        started = time.perf_counter()
        outcome = screen.run(node_plan(0, nnodes, port), served, 0.5, False, "hpctorch/bench/screen/", 120, SCREEN_BUDGET_S,
                             local=lambda _gpus: _screen_record(0), ring=False)
        total_s = time.perf_counter() - started
        results = _reports(children, 300)
    per_node = [count for r in results for count in r["requests"].values()]
    judged = time.perf_counter()
    judge.judge(outcome.records, nnodes, 0.5, node_plan(0, nnodes, port).nodes)
    return {
        "nodes": nnodes,
        "screen_requests_per_node": max(per_node),
        "screen_requests_node0": served.requests,
        "screen_judge_s": time.perf_counter() - judged,
        "screen_total_s": total_s,
        "screen_after_go_s": outcome.after_go_s,
        "screen_records": len(outcome.records),
        "screen_named": len(outcome.bad_nodes),
    }


def _seat(node: int, nnodes: int, port: int):  # type: ignore[no-untyped-def]
    """A seated node of a job with one hot spare (``start.spares.Seat``), counting its requests."""
    from hpctorch.start.spares import Seat

    seat = Seat(replace(node_plan(node, nnodes, port), rdzv_backend="c10d", max_restarts=1), 1, nnodes, spare=False, host=f"nid{node:05d}")
    seat.store, seat.round = CountingStore(_store(port, False)), 0
    return seat


def _claims(seats: dict, nnodes: int) -> dict[str, object]:  # type: ignore[type-arg]
    """Every seated node's workers fail at once, as when one rank dies mid-job: the node whose rank
    was killed (the middle one) claims the round's fault at once, the others, whose ranks exited on
    the broken collectives, after their wait (``RAISED_WAIT_S``); when each knew its verdict."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    known: dict[int, float] = {}

    def node(rank: int) -> None:
        seats[rank].failed(object(), {0: ProcessFailure(0, 1, -9 if rank == nnodes // 2 else 1, "")})
        known[rank] = time.time()

    _as_threads(node, min(seats), max(seats) + 1)
    return {"requests": {n: s.store.requests for n, s in seats.items()}, "leaving": [n for n, s in seats.items() if s.leaving],
            "last": max(known.values())}


def spares_client(first: int, last: int, nnodes: int, port: int) -> None:
    """Simulated seated nodes ``first``..``last - 1``: connected, then told to fail; prints their claims."""
    control = _store(port, False)
    seats = {n: _seat(n, nnodes, port) for n in range(first, last)}
    control.add("bench/spares/ready", 1)
    control.wait(["bench/spares/go"])
    print(json.dumps(_claims(seats, nnodes)), flush=True)


def spares_scale(nnodes: int) -> dict[str, float]:
    """The hot spares' claim of a fault (``start.spares``) at ``nnodes`` seated nodes on one store."""
    from hpctorch.start.spares import RAISED_WAIT_S

    print(f"control_plane_scale: hot spares' claim at {nnodes} nodes", file=sys.stderr, flush=True)
    port = free_port()
    served = _store(port, True)  # the nodes' own requests are counted each by its seat's client
    children = _clients("--spares-client", nnodes, port)
    with _reaped(children):
        mine = {0: _seat(0, nnodes, port)}
        deadline = time.monotonic() + 300
        while served.add("bench/spares/ready", 0) < len(children):
            assert time.monotonic() < deadline, "the simulated nodes never connected"
            time.sleep(0.1)
        go = time.time()
        served.set("bench/spares/go", "1")
        results = [_claims(mine, nnodes)]
        results += _reports(children, 300)
    per_node = [count for r in results for count in r["requests"].values()]  # type: ignore[attr-defined]
    leaving = [n for r in results for n in r["leaving"]]  # type: ignore[attr-defined]
    return {
        "nodes": nnodes,
        "spares_requests_per_node": max(per_node),
        "spares_requests_total": sum(per_node),
        "spares_verdicts_s": max(float(r["last"]) for r in results) - go - RAISED_WAIT_S,  # type: ignore[arg-type]
        "spares_leaving": len(leaving),
        "spares_right_node": leaving == [nnodes // 2],
    }


SPARES_HEADER = ["nodes", "store requests per node", "in all", "every verdict after the wait (s)", "nodes leaving", "the killed one"]


def spares_cells(rows: list[dict]) -> list[list[object]]:
    return [[r["nodes"], r["spares_requests_per_node"], r["spares_requests_total"], f"{r['spares_verdicts_s']:.2f}", r["spares_leaving"],
             "yes" if r["spares_right_node"] else "no"] for r in rows]


STRAGGLE_RANKS = 8
STRAGGLE_ROUNDS = 4
"""Rounds of the watch per simulated node: the fourth is the first with a window of shares (10 s
apart, a 30 s window needs 27 s of samples)."""


def _straggle_files(folder: str, node: int, round_: int) -> None:
    """What a node's 8 workers leave (``straggler_worker``): running totals at 10 s a round; one
    node in 64 has its local rank 0 spend 5% of its time inside collectives, the others 45%."""
    for local in range(STRAGGLE_RANKS):
        share = 0.05 if node % 64 == 63 and local == 0 else 0.45
        t = round_ * 10.0
        data = {"t": t, "inside_s": share * t, "count": round_ * 50, "rank": node * STRAGGLE_RANKS + local}
        with open(os.path.join(folder, f"{local}.json"), "w", encoding="utf-8") as out:
            json.dump(data, out)


def _straggle_watch(node: int, nnodes: int, port: int, root: str):  # type: ignore[no-untyped-def]
    from hpctorch.guard.stragglers import Settings, Watch

    folder = os.path.join(root, str(node))
    os.makedirs(folder, exist_ok=True)
    plan = replace(node_plan(node, nnodes, port), nproc_per_node=(STRAGGLE_RANKS,) * nnodes)
    return Watch(plan, Settings(0.2, 30.0), folder, say=lambda _line: None), folder


def straggle_client(first: int, last: int, nnodes: int, port: int, root: str) -> None:
    """Simulated nodes each run the real ``Watch`` (announce, then a step a round); prints the
    requests each made per round."""
    counts: dict[int, float] = {}

    def node(rank: int) -> None:
        store = CountingStore(_store(port, False))
        watch, folder = _straggle_watch(rank, nnodes, port, root)
        watch.announce(store)
        for round_ in range(STRAGGLE_ROUNDS):
            _straggle_files(folder, rank, round_)
            watch.step(store, round_ * 10.0)
        counts[rank] = (store.requests - 1) / STRAGGLE_ROUNDS
        store.add(f"hpctorch/{RUN_ID}/bench-straggle-done", 1)

    _as_threads(node, first, last)
    print(json.dumps({"requests": counts}), flush=True)


def straggle_scale(nnodes: int) -> dict[str, float]:
    """Node 0's real watch reading every node's record and judging ``nnodes`` x 8 ranks."""
    import tempfile

    print(f"control_plane_scale: stragglers at {nnodes} nodes", file=sys.stderr, flush=True)
    port = free_port()
    served = CountingStore(_store(port, True))
    with tempfile.TemporaryDirectory(prefix="hpctorch-bench-straggle-") as root:
        os.environ["HPCTORCH_BAD_NODES"] = os.path.join(root, "bad-nodes.jsonl")  # the named nodes are simulated: never the user's list
        watch, folder = _straggle_watch(0, nnodes, port, root)
        watch.announce(served)
        children = _clients("--straggle-client", nnodes, port, root)
        with _reaped(children):
            for round_ in range(STRAGGLE_ROUNDS - 1):
                _straggle_files(folder, 0, round_)
                watch.step(served, round_ * 10.0)
            deadline = time.monotonic() + 600
            while served.store.add(f"hpctorch/{RUN_ID}/bench-straggle-done", 0) < nnodes - 1 and time.monotonic() < deadline:
                time.sleep(0.1)
            _straggle_files(folder, 0, STRAGGLE_ROUNDS - 1)
            before = served.requests
            started = time.perf_counter()
            watch.step(served, (STRAGGLE_ROUNDS - 1) * 10.0)
            step_s = time.perf_counter() - started
            node0_requests = served.requests - before
            record_bytes = len(served.store.get(watch.key(1)))
            from hpctorch.guard.stragglers import judge

            records = watch._read_all(served)  # again, to time the parse and judgement alone (the step's includes the store's answer)
            started = time.perf_counter()
            found = judge({n: {int(k): v for k, v in r.get("w", {}).items()} for n, r in records.items()}, watch.plan, 0.2)
            judge_s = time.perf_counter() - started
            results = _reports(children, 300)
    per_node = [count for r in results for count in r["requests"].values()]
    return {"nodes": nnodes, "ranks": nnodes * STRAGGLE_RANKS, "straggle_requests_per_node": max(per_node),
            "straggle_requests_node0": node0_requests, "straggle_record_bytes": record_bytes, "straggle_step_s": step_s,
            "straggle_judge_s": judge_s,
            "straggle_named": len(found), "straggle_expected": nnodes // 64}


STRAGGLE_HEADER = ["nodes", "ranks", "store requests per node per round", "at node 0", "record (bytes)", "node 0's step (s)",
                   "judgement alone (s)", "named", "slowed"]


def straggle_cells(rows: list[dict]) -> list[list[object]]:
    return [[r["nodes"], r["ranks"], f"{r['straggle_requests_per_node']:g}", r["straggle_requests_node0"], r["straggle_record_bytes"],
             f"{r['straggle_step_s']:.3f}", f"{r.get('straggle_judge_s', float('nan')):.3f}", r["straggle_named"], r["straggle_expected"]] for r in rows]


SCREEN_HEADER = ["nodes", "store requests per node", "at node 0", "judgement (s)", "go to verdict (s)", "with arrivals (s)", "records", "nodes named"]


def screen_cells(rows: list[dict]) -> list[list[object]]:
    return [[r["nodes"], r["screen_requests_per_node"], r["screen_requests_node0"], f"{r['screen_judge_s']:.3f}",
             f"{r['screen_after_go_s']:.2f}", f"{r['screen_total_s']:.1f}", r["screen_records"], r["screen_named"]] for r in rows]


def _screen_table(sizes: tuple[int, ...]) -> list[dict[str, float]]:
    rows = [screen_scale(n) for n in sizes]
    print(table(SCREEN_HEADER, screen_cells(rows)))
    return rows


def _files_table(sizes: tuple[int, ...]) -> list[dict[str, float]]:
    """The shared-file channel at each size, printed as a table."""
    files_rows = [shared_files(n) for n in sizes]
    print(table(["nodes", "file calls per node per poll", "at node 0 per poll", "node 0 until all seen", "all seen after polls",
                 "before: per node per poll", "one poll of all (s)"],
                [[r["nodes"], r["files_per_node_per_poll"], r["files_node0_per_poll"], r["files_node0_until_seen"],
                  r["files_all_seen_poll"], r["files_old_per_node_per_poll"], f"{r['files_poll_s']:.2f}"] for r in files_rows]))
    return files_rows


def _save_part(**part: object) -> None:
    """One part's rows beside the saved others, which keep their own command and date."""
    path = ROOT / "benchmarks" / "results" / "control_plane_scale.json"
    saved = json.loads(path.read_text())
    saved.update(part)
    path.write_text(json.dumps(saved, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int | None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, results not saved")
    parser.add_argument("--client", nargs=6, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of idle watching per size")
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 256, 1024, 4096], help="node counts")
    parser.add_argument("--only", choices=["files", "screen", "stragglers", "spares"], default=None,
                        help="the shared-file channel, the screen, the straggler watch, or the hot spares' claim, alone")
    parser.add_argument("--spares-client", nargs=4, type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--screen-client", nargs=4, type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--straggle-client", nargs=5, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.straggle_client:
        straggle_client(*map(int, args.straggle_client[:4]), args.straggle_client[4])  # type: ignore[call-arg]
        return None
    if args.spares_client:
        spares_client(*args.spares_client)
        return None
    if args.screen_client:
        screen_client(*args.screen_client)
        return None
    if args.client:
        first, last, nnodes, port, agree_port = map(int, args.client[:5])
        client(first, last, nnodes, port, agree_port, float(args.client[5]))
        return
    sizes = (4,) if args.smoke else tuple(args.sizes)  # a smoke run shows each part runs: one size does
    if args.smoke:
        global PROCESSES
        PROCESSES = 2  # the same code on tiny sizes: what is shown is that it runs, not its figures
    if args.only == "files":
        files_rows = _files_table(sizes)
        if not args.smoke:  # beside the saved store rows, which keep their own command and date
            _save_part(files_rows=files_rows, files_command=" ".join(["python", "-m", "benchmarks.control_plane_scale", *sys.argv[1:]]),
                       files_date=time.strftime("%Y-%m-%d"))
        return None
    status = isolated("benchmarks.control_plane_scale", sys.argv[1:] if argv is None else argv)
    if status is not None:
        return status
    if args.only == "stragglers":
        straggle_rows = [straggle_scale(n) for n in sizes]
        print(table(STRAGGLE_HEADER, straggle_cells(straggle_rows)))
        if not args.smoke:
            _save_part(straggle_rows=straggle_rows, straggle_command=" ".join(["python", "-m", "benchmarks.control_plane_scale", *sys.argv[1:]]),
                       straggle_date=time.strftime("%Y-%m-%d"))
        return None
    if args.only == "spares":
        spares_rows = [spares_scale(n) for n in sizes]
        print(table(SPARES_HEADER, spares_cells(spares_rows)))
        if not args.smoke:
            _save_part(spares_rows=spares_rows, spares_command=" ".join(["python", "-m", "benchmarks.control_plane_scale", *sys.argv[1:]]),
                       spares_date=time.strftime("%Y-%m-%d"))
        return None
    if args.only == "screen":
        screen_rows = _screen_table(sizes)
        if not args.smoke:
            _save_part(screen_rows=screen_rows, screen_command=" ".join(["python", "-m", "benchmarks.control_plane_scale", *sys.argv[1:]]),
                       screen_date=time.strftime("%Y-%m-%d"))
        return None
    files_rows = _files_table(sizes)
    screen_rows = _screen_table(sizes)
    straggle_rows = [straggle_scale(n) for n in sizes]
    print(table(STRAGGLE_HEADER, straggle_cells(straggle_rows)))
    spares_rows = [spares_scale(n) for n in sizes]
    print(table(SPARES_HEADER, spares_cells(spares_rows)))
    rows = [run(n, 2.0 if args.smoke else args.idle) for n in sizes]
    print(table(["nodes", "store requests/s", "per node/s", "false alarms", "abort known by all (s)", "never knew", "agreement (s)",
                 "agreement CPU (s)"],
                [[r["nodes"], f"{r['requests_per_s']:.0f}", f"{r['per_node_per_s']:.2f}", r["false_alarms"],
                  f"{r['abort_known_s']:.2f}", r["never_knew"], f"{r['agreement_s']:.2f}", f"{r['agreement_cpu_s']:.1f}"] for r in rows]))
    if not args.smoke:
        save("control_plane_scale", {"idle_s": args.idle, "processes": PROCESSES, "rows": rows, "files_rows": files_rows,
                                     "screen_rows": screen_rows, "straggle_rows": straggle_rows, "spares_rows": spares_rows, "notes": NOTES})


if __name__ == "__main__":
    sys.exit(main())

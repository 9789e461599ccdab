"""``hpctorch doctor``: run like the job, on every node; find out why it would not start.

Each node gathers its own facts, meets the others through node 0's TCPStore (on the
job's master address and port, as the job would) and, when the nodes share a
directory, through beating files there (``sharedfiles``), so a node that cannot reach
the master still reports. Nodes probe each other with plain TCP connections, then,
when all reached the store, run a gloo all_reduce (and an NCCL one where CUDA is
present). Node 0 judges all reports (``diagnosis``) and prints one table; every node
exits 0 only when every check passed. Every wait ends by a deadline.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from ..errors import HpctorchError
from ..guard import agreement, authority
from ..guard.sharedfiles import BeatingFiles
from ..host import network
from ..host.facts import resolve
from ..plan.types import Options, Plan
from ..terminal import printable
from . import diagnosis
from .report import local_report, port_holder

PROBE_TIMEOUT_S = 2.0
POLL_S = 0.25
SCREEN_S = (4.0, 15.0)
"""The screen's budget in the doctor: what is left of --timeout less a margin, within these."""


class ProbeListener:
    """A TCP port that accepts and closes, so peers can test reachability without torch."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("", 0))
        self.sock.listen(64)
        self.sock.settimeout(POLL_S)
        self.port = int(self.sock.getsockname()[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def start(self) -> "ProbeListener":
        self._thread.start()
        return self

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self.sock.accept()
                connection.close()
            except OSError:
                continue

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1)
        self.sock.close()


class Meeting:
    """The two channels every node publishes through: node 0's store and shared files. The store
    is authenticated as this job's node 0 and its records sealed (``guard.authority``): what a
    node reports, and node 0's go and exit, are this job's own."""

    PREFIX = "hpctorch/doctor/"

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.store = None
        self.not_a_store = False
        self.serve_error: str | None = None
        self.auth_error: str | None = None
        """Why the store at node 0's port is not this job's node 0 (it answered, and did not authenticate)."""
        self.files = BeatingFiles(_doctor_dir(plan), plan.node_rank, {})

    def open(self) -> None:
        if self.plan.is_master:
            if self.plan.master_port and not network.port_is_free("", self.plan.master_port):
                self.serve_error = "in use"
                return
            try:
                # The store's own client goes through loopback: whether the master address
                # answers is probed separately, like from every other node.
                served = agreement.open_store(replace(self.plan, master_addr="127.0.0.1"), PROBE_TIMEOUT_S * 2)
                self.store = authority.sealed(served, self.plan, PROBE_TIMEOUT_S * 2, serve=True)
            except Exception as exc:  # noqa: BLE001 - torch raises several kinds here
                self.serve_error = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__

    def try_connect(self) -> None:
        if self.store is not None or self.plan.is_master or self.not_a_store:
            return
        if self.files.live.get(0, {}).get("hello", {}).get("serving") is False:
            return  # node 0 said, through the shared files, that it could not serve
        if not network.connect(self.plan.master_addr, self.plan.master_port, POLL_S)["ok"]:
            return
        # Something listens there; a program that is not a store may never answer
        # torch's handshake, so the connection is made in a thread given a deadline.
        made: list[object] = []
        thread = threading.Thread(target=lambda: made.append(self._connect()), daemon=True)
        thread.start()
        thread.join(PROBE_TIMEOUT_S + 1)
        store = made[0] if made else None
        if store is None:
            self.not_a_store = True  # another program holds the port: do not ask again
            return
        self.store = store
        for kind, value in list(self.files.record.items()):  # what was published before
            self.put(kind, value)

    def _connect(self):  # type: ignore[no-untyped-def]
        try:
            reached = agreement.open_store(self.plan, PROBE_TIMEOUT_S)
        except Exception:  # noqa: BLE001
            return None
        try:
            return authority.sealed(reached, self.plan, PROBE_TIMEOUT_S, serve=False)
        except authority.AuthError as exc:
            self.auth_error = exc.cause
            return None

    def put(self, kind: str, value: object) -> None:
        text = json.dumps(value)
        self.files.publish(**{kind: value})
        if self.store is not None:
            try:
                self.store.set(f"{self.PREFIX}{kind}/{self.plan.node_rank}", text)
            except Exception:  # noqa: BLE001
                self.store = None

    def gather(self, kind: str, until: float, want_store: bool = False) -> tuple[dict[int, dict], set[int]]:
        """Every node's ``kind`` record seen by ``until``: (records, nodes seen through the store)."""
        nodes = range(self.plan.nnodes)
        while True:
            self.files.publish()
            self.try_connect()
            found: dict[int, dict] = {n: r[kind] for n, r in self.files.read_live().items() if kind in r}
            found[self.plan.node_rank] = self.files.record.get(kind)  # type: ignore[assignment]
            via_store: set[int] = set()
            if self.store is not None:
                try:
                    for n in nodes:
                        key = f"{self.PREFIX}{kind}/{n}"
                        if self.store.check([key]):
                            value = self.store.opened([key])[0]
                            if value is not None:  # else planted: not this job's node n
                                found[n] = json.loads(value)
                                via_store.add(n)
                except Exception:  # noqa: BLE001 - node 0 went away
                    self.store = None
            on_store = want_store and self.store is not None and not self.not_a_store
            complete = len(via_store) == self.plan.nnodes if on_store else len(found) == self.plan.nnodes
            if complete or time.monotonic() > until:
                return found, via_store
            time.sleep(POLL_S)

    def wait_key(self, key: str, until: float) -> str | None:
        while time.monotonic() < until:
            self.files.publish()
            if self.store is not None:
                try:
                    if self.store.check([self.PREFIX + key]):
                        value = self.store.opened([self.PREFIX + key])[0]
                        if value is not None:  # else planted: waited for as if absent
                            return value.decode()
                except Exception:  # noqa: BLE001
                    self.store = None
            master_file = self.files.read_live().get(0, {})
            if key in master_file:
                return str(master_file[key])
            time.sleep(POLL_S)
        return None

    def set_key(self, key: str, value: str) -> None:
        self.files.publish(**{key: value})
        if self.store is not None:
            try:
                self.store.set(self.PREFIX + key, value)
            except Exception:  # noqa: BLE001
                pass


def _doctor_dir(plan: Plan) -> str | None:
    return plan.agreement_dir[: -len(".agreement")] + ".doctor" if plan.agreement_dir else None


def _probe_peers(plan: Plan, hellos: Mapping[int, Mapping]) -> dict[str, list[dict[str, object]]]:
    """Every peer's probe port, on its chosen address and on each of its others."""
    jobs = []
    for node, hello in hellos.items():
        if node == plan.node_rank or not hello:
            continue
        for entry in hello["addresses"]:
            jobs.append((str(node), entry["iface"], entry["addr"], hello["probe_port"], entry["addr"] == hello["chosen"]))
    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(lambda j: {"iface": j[1], "addr": j[2], "chosen": j[4], **network.connect(j[2], j[3], PROBE_TIMEOUT_S)}, jobs))
    peers: dict[str, list[dict[str, object]]] = {}
    for job, result in zip(jobs, results):
        peers.setdefault(job[0], []).append(result)
    return peers


def _collective(backend: str, plan: Plan, store, timeout_s: float) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """Initialise a process group of one process per node and check a sum (the link's speed is the
    screen's, bounded in time: a timed all_reduce of fixed size took 10 s on a 20 Mbit/s link)."""
    import torch
    import torch.distributed as dist

    started = time.perf_counter()
    try:
        device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
        if backend == "nccl":
            torch.cuda.set_device(device)
        prefixed = dist.PrefixStore(f"hpctorch/doctor/{backend}", authority.plain(store))  # torch's own keys
        dist.init_process_group(backend, store=prefixed, rank=plan.node_rank, world_size=plan.nnodes,
                                timeout=datetime.timedelta(seconds=timeout_s))
        value = torch.full((4,), float(plan.node_rank + 1), device=device)
        dist.all_reduce(value)
        init_s = time.perf_counter() - started
        expected = plan.nnodes * (plan.nnodes + 1) / 2
        if not bool((value == expected).all()):
            return {"ok": False, "error": f"all_reduce gave {value.tolist()[0]}, expected {expected}", "init_s": init_s}
        dist.destroy_process_group()
        return {"ok": True, "error": None, "init_s": init_s, "world": plan.nnodes}
    except Exception as exc:  # noqa: BLE001 - the failure is the finding
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return {"ok": False, "error": first[:300], "init_s": time.perf_counter() - started}


def examine(plan: Plan, env: Mapping[str, str], timeout_s: float, json_path: str | None) -> int:
    """This node's part of the doctor; node 0 prints the table. The exit status."""
    started = time.monotonic()
    hello_until = started + timeout_s * 0.4
    final = started + timeout_s
    os.environ.update(plan.common_env)  # GLOO_SOCKET_IFNAME etc., as the job's workers get them
    report = local_report(plan, None, env)
    listener = ProbeListener().start()
    meeting = Meeting(plan)
    try:
        meeting.open()
        report["serve_error"] = meeting.serve_error
        report["port_holder"] = port_holder(plan.master_port) if meeting.serve_error else None
        addresses = [{"iface": i["name"], "addr": a.split("/")[0]} for i in report["interfaces"]  # type: ignore[union-attr]
                     for a in i["addresses"] if ":" not in a and (not a.startswith("127.") or a.split("/")[0] == report["address"])]
        hello = {"host": report["host"], "probe_port": listener.port, "addresses": addresses, "chosen": report["address"],
                 "serving": meeting.serve_error is None if plan.is_master else None}
        meeting.put("hello", hello)
        hellos, via_store = meeting.gather("hello", hello_until, want_store=True)
        reach: dict[str, object] = {"peers": _probe_peers(plan, hellos)}
        if plan.master_port:
            # A name is shown with what it resolves to here: the trap is often in that answer.
            resolved = resolve(plan.master_addr)
            shown = plan.master_addr if not resolved or resolved[0] == plan.master_addr else f"{plan.master_addr} ({resolved[0]})"
            reach["master"] = {"target": f"{shown}:{plan.master_port}", "address": resolved[0] if resolved else plan.master_addr,
                               **network.connect(plan.master_addr, plan.master_port, PROBE_TIMEOUT_S)}
            master_hello = hellos.get(0)
            if master_hello and not reach["master"]["ok"]:  # type: ignore[index]
                reach["master_host"] = network.connect(plan.master_addr, int(master_hello["probe_port"]), PROBE_TIMEOUT_S)
        report["reach"] = reach
        report["store"] = meeting.store is not None
        report["store_auth_error"] = meeting.auth_error
        _collectives(plan, meeting, report, via_store, hello_until, final)
        meeting.put("report", report)
        if not plan.is_master:
            return _await_verdict(plan, meeting, report, final)
        reports, _ = meeting.gather("report", final)
        reports = {n: r for n, r in reports.items() if r}
        found = diagnosis.verdicts(reports, plan.nnodes, plan.nodes)
        # With --json - the JSON alone goes to stdout (a program reads it), the table to stderr.
        print(printable(diagnosis.table(reports, plan.nnodes, found)), file=sys.stderr if json_path == "-" else sys.stdout, flush=True)
        code = 1 if any(v.severity == "fail" for v in found) else 0
        if json_path:
            _write_json(json_path, {"nnodes": plan.nnodes, "reports": reports, "verdicts": [v.__dict__ for v in found], "exit": code})
        meeting.set_key("exit", str(code))
        meeting.files.linger(agreement.GRACE_S, POLL_S)  # so nodes reading the files see the verdict
        return code
    finally:
        listener.close()
        meeting.files.remove()


def _collectives(plan: Plan, meeting: Meeting, report: dict, via_store: set[int], hello_until: float, final: float) -> None:
    """Node 0 decides for all (every node on its store, or none runs), then gloo and NCCL."""
    if plan.is_master:
        go = len(via_store) == plan.nnodes and meeting.store is not None
        meeting.set_key("go", "1" if go else "0")
    else:
        go = meeting.store is not None and meeting.wait_key("go", hello_until + 5) == "1"
    if not go:
        report["gloo_skipped"] = report["nccl_skipped"] = "not every node reached node 0's store"
        return
    budget = max(5.0, (final - time.monotonic()) / 3)
    report["gloo"] = _collective("gloo", plan, meeting.store, budget)
    import torch

    if torch.cuda.is_available():
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        report["nccl"] = _collective("nccl", plan, meeting.store, budget)
    else:
        report["nccl_skipped"] = "no CUDA device here"
    from ..screen import exchange as screen

    budget_s = min(SCREEN_S[1], max(SCREEN_S[0], final - time.monotonic() - 5))
    try:
        outcome = screen.run(plan, meeting.store, screen.judge.DEFAULT_THRESHOLD, torch.cuda.is_available(), Meeting.PREFIX + "screen/", 5.0, budget_s)
    except Exception as exc:  # noqa: BLE001 - node 0's store failed under it: the finding is that
        report["screen_skipped"] = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return
    report["screen"] = outcome.as_dict()


def _await_verdict(plan: Plan, meeting: Meeting, report: dict, final: float) -> int:
    code = meeting.wait_key("exit", final + 5)
    who = f"node {plan.node_rank} ({report['host']})"
    if code is not None:
        print(f"hpctorch doctor: {who}: report sent; node 0 printed the table (exit {code})", file=sys.stderr, flush=True)
        return int(code)
    # Node 0 never answered: this node's own report is all the user will see of it.
    found = diagnosis.verdicts({plan.node_rank: report}, 1)
    reach = report.get("reach", {})
    lines = [f"hpctorch doctor: {who}: no word from node 0 within the deadline; this node's own findings:"]
    if reach.get("master") and not reach["master"]["ok"]:
        lines.append(f"  FAIL cannot reach the master at {reach['master']['target']}: {reach['master']['error']}")
    lines.extend(f"  {v.line()}" for v in found)
    print(printable("\n".join(lines)), file=sys.stderr, flush=True)
    return 1


def _write_json(path: str, data: object) -> None:
    text = json.dumps(data, indent=2, sort_keys=True, default=str)
    if path == "-":
        print(text)
        return
    with open(path, "w", encoding="utf-8") as out:
        out.write(text + "\n")


def plan_for_doctor(options: Options, env: Mapping[str, str]) -> Plan:
    from ..plan.discover import plan_here

    return plan_here(replace(options, command=("doctor",)), env)


def run(options: Options, env: Mapping[str, str], timeout_s: float, json_path: str | None, argv: list[str]) -> int:
    """The ``hpctorch doctor`` command on this node."""
    try:
        plan = plan_for_doctor(options, env)
    except HpctorchError as exc:
        report = local_report(None, exc.line(), env)
        print(f"hpctorch doctor: {report['host']}: cannot plan the job: {exc.line()}", file=sys.stderr)
        if json_path:
            _write_json(json_path, {"reports": {"?": report}, "exit": 1})
        return 1
    if plan.mode == "relaunch":
        from ..start.launch import exec_relaunch

        exec_relaunch(plan, argv)
    if plan.simulated:
        return _simulate(plan, options, timeout_s, json_path)
    if plan.mode in ("per-task", "unchanged") and plan.workers and plan.workers[0].local_rank != 0:
        return 0  # one doctor per node: local task 0 speaks for its node
    if plan.nnodes == 1:
        plan = replace(plan, master_port=plan.master_port or network.free_port())
    return examine(plan, env, timeout_s, json_path)


def _simulate(plan: Plan, options: Options, timeout_s: float, json_path: str | None) -> int:
    """One doctor process per simulated node, each with the node's flags."""
    import subprocess
    import tempfile

    count = len(plan.node_plans)
    shared = tempfile.mkdtemp(prefix="hpctorch-doctor-")
    processes = []
    for node in range(count):
        argv = [sys.executable, "-m", "hpctorch", "doctor", "--nnodes", str(count), "--node-rank", str(node),
                "--master-addr", "127.0.0.1", "--master-port", str(plan.master_port), "--timeout", str(timeout_s),
                "--nproc-per-node", str(plan.nproc_per_node[0]), "--rendezvous-dir", shared]
        if json_path and node == 0:
            argv += ["--json", json_path]
        processes.append(subprocess.Popen(argv))
    try:
        codes = [p.wait(timeout=timeout_s + 30) for p in processes]
    except subprocess.TimeoutExpired:
        for process in processes:
            process.kill()
        return 1
    finally:
        import shutil

        shutil.rmtree(shared, ignore_errors=True)
    return max(codes)

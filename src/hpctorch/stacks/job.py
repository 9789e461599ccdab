"""Job-wide stack dumps: each node takes its own workers' stacks and keeps the full dump in a
local file; the grouped form travels to node 0 through the job's store, which prints it.

Used by ``hpctorch stacks`` (on demand), by the agent when the job stalls (``--stall-timeout``)
and when it is torn down (a rank died, a node went silent, a signal): the survivors' stacks
are taken first, within ``TEARDOWN_BUDGET_S``, before torch's agent stops them.
Store traffic: one ``set`` and one ``append`` per node per dump; node 0 polls one key with
backoff, then reads the new parts in one ``multi_get``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping

from ..errors import HpctorchError
from ..host.folders import RANK_KEYS, create_private_file, node_dir, private_dir, rank_file, read_without_link, sweep
from . import groups
from .dump import RankStack, Worker, capture

TEARDOWN_BUDGET_S = 2.0
TEARDOWN_TITLE = "where the other ranks were when the job was stopped"
FRESH_S = 120.0
DUMPS_KEPT_S = 7 * 86400.0
"""Stack dumps older than this are removed when the next one is written on the node."""
"""A part older than this (left by a dump whose node 0 never collected it) is ignored."""


def write_dump(stacks: Iterable[RankStack], label: str) -> str | None:
    """Every thread of every rank to a new file; its path (None if it cannot be written)."""
    path = os.path.join(node_dir(), f"stacks-{time.strftime('%Y%m%d-%H%M%S')}-{label}-{os.getpid()}.txt")
    try:
        sweep(private_dir(node_dir()), (".txt",), DUMPS_KEPT_S, prefix="stacks-")
        with open(create_private_file(path), "w", encoding="utf-8") as out:
            out.write(groups.full_text(stacks))
    except (OSError, HpctorchError):
        return None
    return path


def rank_variables(pid: int, env: Mapping[str, str]) -> Mapping[str, str] | None:
    """A worker's environment with its rank (None: not a rank): as the process was started, or,
    for a warm standby that became a worker (started before its attempt's ranks were known), with
    the rank variables it wrote in its stacks folder, in a file of this user's that only it reads."""
    if "RANK" in env:
        return env
    directory = env.get("HPCTORCH_STACKS_DIR")
    if not directory:
        return None
    try:
        stat, text = read_without_link(rank_file(directory, pid))
        told = json.loads(text)
    except (OSError, ValueError):
        return None
    if stat.st_uid != os.getuid() or stat.st_mode & 0o077 or not isinstance(told, dict) or "RANK" not in told:
        return None
    return {**env, **{key: str(told[key]) for key in RANK_KEYS if key in told}}


def ranks_among(found: Mapping[int, tuple[int, Mapping[str, str]]]) -> list[tuple[int, Mapping[str, str]]]:
    """Of processes (pid: its parent's pid, its environment with a rank), the ranks: one whose
    parent is the same rank of the same run (a data loader worker) is not a rank of its own."""
    ranks = []
    for pid, (ppid, env) in found.items():
        parent = found.get(ppid)
        if parent and parent[1].get("RANK") == env["RANK"] and parent[1].get("TORCHELASTIC_RUN_ID") == env.get("TORCHELASTIC_RUN_ID"):
            continue
        ranks.append((pid, env))
    return ranks


def worker_of(pid: int, env: Mapping[str, str], host: Callable[[Mapping[str, str], int], str]) -> Worker:
    node = int(env.get("GROUP_RANK", "0") or 0)
    return Worker(pid, int(env["RANK"]), int(env.get("LOCAL_RANK", "0") or 0), node, host(env, node), env.get("HPCTORCH_STACKS_DIR"))


def publish(store, prefix: str, nodes: list[int], groups: list[dict]) -> None:  # type: ignore[no-untyped-def]
    """A node's groups for node 0: one key, then its name on the list node 0 polls."""
    store.set(f"{prefix}part/{nodes[0]}", json.dumps({"t": time.time(), "nodes": nodes, "groups": groups}))
    store.append(f"{prefix}who", f"{nodes[0]},")


def collect(store, prefix: str, covered: set[int], nnodes: int, timeout_s: float) -> tuple[list[list[dict]], set[int]]:  # type: ignore[no-untyped-def]
    """Node 0: the other nodes' groups as they arrive, until all are in or the time is up.
    One request per poll (with backoff) whatever N, one multi_get of the new parts; the keys
    are removed afterwards so the next dump starts clean."""
    deadline, pause, started = time.monotonic() + timeout_s, 0.05, time.time()
    covered, parts, listed = set(covered), [], set()
    fresh: set[int] = set()
    while len(covered) < nnodes and time.monotonic() < deadline:
        time.sleep(pause)
        pause = min(1.0, pause * 1.5)
        if not store.check([f"{prefix}who"]):
            continue
        listing = getattr(store, "get_plain", store.get)(f"{prefix}who")  # an appended list: never sealed
        names = {int(n) for n in listing.decode().split(",") if n.isdigit()}
        listed |= names
        new = sorted(names - fresh)
        keys = [f"{prefix}part/{n}" for n in new]
        # Under the run's seal (the watchdog's store): a part someone else planted is left out.
        values = getattr(store, "opened", store.multi_get)(keys) if new else []
        for node, value in zip(new, values):
            try:
                data = json.loads(value)  # None (its seal did not check): TypeError
                when, nodes, groups = float(data["t"]), set(data["nodes"]), data["groups"]
            except (ValueError, TypeError, KeyError):
                continue  # not a part this job's nodes write
            if when > started - FRESH_S and not nodes <= covered:
                fresh.add(node)
                parts.append(groups)
                covered.update(nodes)
    for key in [f"{prefix}who", *(f"{prefix}part/{n}" for n in listed)]:
        try:
            store.delete_key(key)
        except Exception:  # noqa: BLE001 - the store may be going away; only tidiness is lost
            pass
    return parts, covered


class NodeStacks:
    """This agent's workers' stacks (per-node mode), for a stall dump and for the teardown."""

    def __init__(self, plan, method: str = "auto", parent: int | None = None) -> None:  # type: ignore[no-untyped-def]
        """``parent``: the process whose children the workers are (this one by default; the
        supervisor's, from its watchdog helper)."""
        self.plan = plan
        self.parent = parent
        self.method = method
        self.prefix = f"hpctorch/{plan.run_id}/stacks/"
        self.teardown: tuple[list[dict], str | None] | None = None
        """The groups and dump file of the survivors' stacks, once taken at teardown."""
        self.tearing_down = False
        """torch's agent is stopping the workers: an abort from another node need not signal it."""

    def workers(self) -> list[Worker]:
        """This agent's live workers: the processes below it with the job's run id and a rank (a
        zombie has no environ); a warm standby's are its zygote's children, and a worker's own
        children of the same rank (data loaders) are not ranks."""
        import psutil

        found: dict[int, tuple[int, Mapping[str, str]]] = {}
        for child in psutil.Process(self.parent).children(recursive=True):
            try:
                env = rank_variables(child.pid, child.environ())
                parent = child.ppid()
            except psutil.Error:
                continue
            if env is not None and env.get("TORCHELASTIC_RUN_ID") == self.plan.run_id:
                found[child.pid] = (parent, env)
        return sorted((worker_of(pid, env, self._host) for pid, env in ranks_among(found)), key=lambda w: w.rank)

    def _host(self, _env: Mapping[str, str], node: int) -> str:
        import socket

        return self.plan.nodes[node] if self.plan.nodes and node < len(self.plan.nodes) else socket.gethostname()

    def take(self, label: str, budget_s: float = TEARDOWN_BUDGET_S) -> tuple[list[dict], str | None]:
        stacks = capture(self.workers(), self.method, budget_s=budget_s)
        return groups.groups(stacks), (write_dump(stacks, f"{label}-node{self.plan.node_rank}") if stacks else None)

    def take_at_teardown(self, store) -> None:  # type: ignore[no-untyped-def]
        """Before torch's agent stops the workers, sent to node 0 when there are several nodes.
        torch may stop them twice (after a failure, then on its way out): the second time,
        with nobody left, keeps the first."""
        self.tearing_down = True
        taken = self.take("teardown")
        if self.teardown is not None and not taken[0]:
            return
        self.teardown = taken
        self.send_teardown(store)

    def send_teardown(self, store) -> None:  # type: ignore[no-untyped-def]
        """This node's part of the teardown stacks, to node 0 (which reads its own)."""
        if self.teardown is not None and store is not None and self.plan.nnodes > 1 and not self.plan.is_master:
            try:
                publish(store, self.prefix + "teardown/", [self.plan.node_rank], self.teardown[0])
            except Exception:  # noqa: BLE001 - node 0 says it had no answer from this node
                pass

    def lines(self, store, kind: str, own: tuple[list[dict], str | None], timeout_s: float, title: str = "stacks") -> list[str]:  # type: ignore[no-untyped-def]
        """Node 0: the grouped summary of every node's part of one dump."""
        parts, covered = [own[0]], {0}
        if store is not None and self.plan.nnodes > 1:
            more, covered = collect(store, f"{self.prefix}{kind}/", covered, self.plan.nnodes, timeout_s)
            parts.extend(more)
        missing = [self._host({}, n) for n in range(self.plan.nnodes) if n not in covered]
        merged = groups.merge(parts)
        if all(group["text"] == "exited" for group in merged):
            return []  # nobody left to show
        return groups.summary(merged, self.plan.nnodes, own[1], missing, title)


    def teardown_summary(self, store=None, timeout_s: float = 0.0) -> list[str]:  # type: ignore[no-untyped-def]
        """Node 0: the survivors' stacks taken at teardown, with the other nodes' (``store``)."""
        return self.lines(store, "teardown", self.teardown, timeout_s, TEARDOWN_TITLE) if self.teardown is not None else []

def install_teardown_capture(take: Callable[[], None], after: Callable[[object], None] = lambda _context: None,
                             failed: Callable[[object, dict], None] | None = None) -> None:
    """Run ``take`` just before torch stops the workers (every way a run ends: a failed rank,
    a signal, success; a restart), and ``after(context)`` once they are stopped. torch offers no hook
    there; ``PContext.close`` is the public method every path goes through (torch 2.1 to 2.13:
    the agent's shutdown, and the process context itself as soon as one worker failed).
    ``failed(context, failures)`` first, where workers failed (the context's ``_failures``, local
    rank -> ProcessFailure, filled before it closes: torch 2.1 to 2.13)."""
    from torch.distributed.elastic.multiprocessing.api import PContext

    original = PContext.close
    if getattr(original, "_hpctorch", False):
        return

    def close(context, *args, **kwargs):  # type: ignore[no-untyped-def]
        failures = getattr(context, "_failures", None)
        if failed is not None and failures:
            try:
                failed(context, dict(failures))
            except Exception:  # noqa: BLE001 - the policy must never stop the teardown
                pass
        try:
            take()
        except Exception:  # noqa: BLE001 - a dump must never stop the teardown
            pass
        try:
            return original(context, *args, **kwargs)
        finally:
            after(context)

    close._hpctorch = True  # type: ignore[attr-defined]
    PContext.close = close  # type: ignore[method-assign]

"""The Plan as people read it: one row per decision, with its reason."""

from __future__ import annotations

import shlex
import sys

from ..schedulers import hostlist
from .types import TORCH_AGENT_VARS, Plan


def command_line(argv, platform: str = sys.platform) -> str:  # type: ignore[no-untyped-def]
    """``argv`` as one line to copy into this platform's shell: POSIX quoting, or on Windows the
    rules CreateProcess and the C runtime parse back (spaces, backslashes, quotes)."""
    import subprocess

    return subprocess.list2cmdline(list(argv)) if platform == "win32" else shlex.join(argv)


def _per_worker(plan: Plan, var: str) -> str:
    sets = [(w.rank, w.env.get(var)) for w in plan.workers]
    return "; ".join(f"rank {rank}: {value}" for rank, value in sets if value) or "none"


def _starter(plan: Plan) -> str:
    return "hpctorch (no torch agent)" if plan.starter == "hpctorch" else "torch's elastic agent"


def _master(plan: Plan) -> str:
    if plan.master_addr is not None:
        return plan.master_addr
    if plan.master_exchange:
        return f"(read at start from {plan.master_exchange})"
    return "(decided on each node once relaunched)"


def _counts(plan: Plan) -> tuple[str, str, str]:
    """(node count, this node's rank, world size) as words: torch may settle them at the rendezvous."""
    sizes = sorted(set(plan.nproc_per_node))
    per = sizes[0]
    nodes = f"{plan.min_nodes}-{plan.nnodes}" if plan.min_nodes else str(plan.nnodes)
    world = f"{plan.min_nodes * per}-{plan.world_size}" if plan.min_nodes and len(sizes) == 1 else str(plan.world_size)
    rank = str(plan.node_rank) if plan.node_rank_known else "?"
    return nodes, rank, world


AUTHORITY = ("every record a node acts on is sealed with a secret node 0 makes for this run and hands only to your uid: "
             "a MUNGE credential restricted to your uid where munged answers (the socket Slurm's AuthInfo names), else a 0600 "
             "file in ~/.local/state/hpctorch/job-secrets (else the job's shared folder); a node refuses, in one line, a store "
             "that does not authenticate")


def table(plan: Plan, explain: bool = False) -> str:
    port = str(plan.master_port) if plan.master_port else "(a free port bound at start)"
    nodes = hostlist.compress(plan.nodes) if plan.nodes else "(not named by the launcher)"
    sizes = sorted(set(plan.nproc_per_node))
    per_node = str(sizes[0]) if len(sizes) == 1 else ",".join(map(str, plan.nproc_per_node))
    count, rank, world = _counts(plan)
    rows = [
        ("scheduler", plan.scheduler + (f" job {plan.job_id}" if plan.job_id else ""), "scheduler"),
        ("mode", plan.mode + (" (simulated nodes)" if plan.simulated else ""), "mode"),
        *([("started by", _starter(plan), "starter")] if plan.mode == "per-node" else []),
        ("nodes", f"{count}: {nodes}", "nodes"),
        ("node rank", f"{rank} of {count}", "node_rank"),
        ("processes", f"{per_node} per node, world size {world}", "nproc_per_node"),
        ("master", _master(plan), "master_addr"),
        ("port", port, "master_port"),
        *([("if held", ", ".join(map(str, plan.master_ports[1:])), "master_ports")] if len(plan.master_ports) > 1 else []),
        *([("watchdog port", str(plan.watch_port), "watch_port")] if plan.watch_port else []),
        ("interface", plan.iface or "(left to torch)", "iface"),
        ("rendezvous", f"{plan.rdzv_backend}, timeout {plan.rdzv_timeout} s", "rdzv_backend"),
        ("gpus", _per_worker(plan, "HPCTORCH_DEVICES"), "devices"),
        ("cpu bind", _per_worker(plan, "HPCTORCH_CPUS"), "cpu_bind"),
        ("command", command_line(plan.command) if plan.command else "(none given)", ""),
    ]
    if plan.container:
        rows.insert(1, ("container", plan.container, ""))
    if plan.mode == "relaunch":
        rows.insert(2, ("relaunch", command_line(plan.relaunch), ""))
    reasons = dict(plan.reasons)
    if plan.sources.get("profile"):
        name, _, why = plan.sources["profile"].partition(" (")
        rows.insert(0, ("site", name, "profile"))
        reasons["profile"] = why.rstrip(")")
    lines = ["hpctorch plan"]
    for label, value, key in rows:
        reason = reasons.get(key, "")
        line = f"  {label:<11} {value}"
        if reason:
            line = f"{line:<46}  <- {reason}"
        lines.append(line)
    if explain:
        lines.append("where each value came from:")
        lines.extend(f"  {name:<16} {origin}" for name, origin in sorted(plan.sources.items()))
        lines.extend(f"  {var:<16} {why}" for var, why in sorted(plan.reasons.items()) if var.isupper())
        if plan.nnodes > 1 or plan.mode == "per-task":
            lines.append(f"  {'records':<16} {AUTHORITY}")
    if plan.common_env:
        lines.append("added to every worker's environment:")
        lines.extend(f"  {k}={v}" for k, v in sorted(plan.common_env.items()))
    if plan.mode == "per-node" and plan.workers:
        lines.append(f"torch's elastic agent sets each worker's {', '.join(TORCH_AGENT_VARS)}")
    lines.append(f"workers on this machine ({len(plan.workers)}):")
    if plan.agent:
        lines.append("torch's agent, as torchrun's options set it: " + ", ".join(f"{k}={v}" for k, v in sorted(plan.agent.items())))
    for worker in plan.workers:
        own = " ".join(f"{k}={v}" for k, v in sorted(worker.env.items()) if plan.common_env.get(k) != v)
        rank = worker.rank if plan.node_rank_known else "?"
        lines.append(f"  rank {rank} (local {worker.local_rank}): {own or '(nothing more)'}")
    return "\n".join(lines)


def _short(reason: str) -> str:
    """A reason cut to its first clause, for the banner."""
    first = reason.split(";")[0].strip()
    return first if len(first) <= 70 else first[:67] + "..."


def banner(plan: Plan) -> str:
    """What ``hpctorch run`` prints before the job's own output: a few lines, each decision
    with its reason; the whole table is ``hpctorch plan`` (``run --verbose``)."""
    nodes = hostlist.compress(plan.nodes) if plan.nodes else "not named by the launcher"
    sizes = sorted(set(plan.nproc_per_node))
    per_node = str(sizes[0]) if len(sizes) == 1 else ",".join(map(str, plan.nproc_per_node))
    job = f"{plan.scheduler} job {plan.job_id}" if plan.job_id else plan.scheduler
    count, _, world = _counts(plan)
    lines = [f"hpctorch: {count} node(s) ({nodes}) x {per_node} = world size {world}, {job}"]
    port = str(plan.master_port) if plan.master_port else "(free port)"
    rows = [
        ("mode", plan.mode + (" (simulated nodes)" if plan.simulated else ""), plan.reasons.get("mode", "")),
        *([("started by", _starter(plan), plan.reasons.get("starter", ""))] if plan.mode == "per-node" and not plan.simulated else []),
        ("master", _master(plan), plan.reasons.get("master_addr", "")),
        ("interface", plan.iface or "(left to torch)", plan.reasons.get("iface", "")),
        ("port", port, plan.reasons.get("master_port", "")),
    ]
    if plan.container:
        rows.append(("container", plan.container, ""))
    for label, value, reason in rows:
        lines.append(f"  {label:<10} {value}" + (f"   <- {_short(reason)}" if reason else ""))
    lines.append("  (the whole plan: hpctorch plan --explain, or run --verbose)")
    return "\n".join(lines)

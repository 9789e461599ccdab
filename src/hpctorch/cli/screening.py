"""``run --screen`` and ``--spare-nodes`` from the command line: screen before the start, then
the plan on the nodes kept."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from ..errors import HpctorchError
from ..plan.types import Options, Plan
from ..schedulers import hostlist

if TYPE_CHECKING:  # the start stage's module: imported where a seat is made (--spare-nodes)
    from ..start.spares import Seat


def screen(args: argparse.Namespace, plan: Plan):  # type: ignore[no-untyped-def]
    """``--screen``: measure every node before the workers start; node 0 names the bad ones."""
    from ..screen import exchange as screening

    store = screening.connect(plan, plan.rdzv_timeout)
    try:
        outcome = screening.run(plan, store, args.screen_threshold, _uses_gpus(plan), f"hpctorch/{plan.run_id}/screen/", plan.rdzv_timeout,
                             spares=args.spare_nodes)
    finally:
        del store  # node 0's store leaves the master port to the job's own
    from .. import timings

    timings.mark("screen done")
    screening.report(plan, outcome, args.screen_threshold, args.screen or "warn", os.environ)
    return outcome


def _flag(args: argparse.Namespace) -> str:
    return "--spare-nodes" if args.spare_nodes else "--screen"


def check_args(args: argparse.Namespace) -> None:
    """What the command line alone contradicts, before anything is planned or printed."""
    if (args.screen or args.spare_nodes) and args.simulate_nodes:
        raise HpctorchError(f"{_flag(args)} measures real nodes, and --simulate-nodes runs them all on this machine",
                            "drop one of them ('hpctorch doctor --simulate-nodes N' shows the screen's figures without judging them)")


def check_per_task(args: argparse.Namespace, plan: Plan) -> None:
    """Where the launcher set every variable (torchrun's agent), there is nothing to renumber."""
    if (args.screen or args.spare_nodes) and plan.mode != "per-task":
        raise HpctorchError(f"{_flag(args)} needs one hpctorch per node, and this is a {plan.mode} run "
                            f"({plan.reasons.get('mode', 'every rank started by the launcher')})",
                            "start one hpctorch per node (e.g. srun --ntasks-per-node=1 hpctorch run --nproc-per-node N), or run 'hpctorch doctor' first")


def check_spares(args: argparse.Namespace, plan: Plan) -> None:
    """--spare-nodes against the plan: something must be left to run on."""
    if not args.spare_nodes:
        return
    if plan.nnodes == 1:
        raise HpctorchError(f"--spare-nodes {args.spare_nodes} on a single node leaves nothing to run on", "drop --spare-nodes, or run on several nodes")
    if args.spare_nodes >= plan.nnodes:
        raise HpctorchError(f"--spare-nodes {args.spare_nodes} of {plan.nnodes} nodes leaves nothing to run on",
                            f"give at most {plan.nnodes - 1}, or ask the scheduler for more nodes")
    if plan.max_restarts and plan.mode != "per-node":
        raise HpctorchError(f"--spare-nodes with --max-restarts (hot spares) needs one hpctorch per node, and this is a {plan.mode} run",
                            "start one hpctorch per node (e.g. srun --ntasks-per-node=1 hpctorch run --nproc-per-node N), or drop --max-restarts")
    if plan.max_restarts and (plan.rdzv_backend != "c10d" or plan.min_nodes is not None):
        why = f"--rdzv-backend {plan.rdzv_backend}" if plan.rdzv_backend != "c10d" else f"--nnodes {plan.min_nodes}:{plan.nnodes}"
        raise HpctorchError(f"--spare-nodes with --max-restarts (hot spares) waits in torch's c10d rendezvous at a fixed node count, not with {why}",
                            "drop that option: hpctorch then uses torch's c10d rendezvous on the nodes the screen kept")


def per_task(args: argparse.Namespace, plan: Plan, options: Options) -> Plan | None:
    """Per task (the launcher started every rank): each node's first rank screens for its node,
    the node's other ranks wait for node 0's verdict; then, with --spare-nodes, every rank's plan
    on the nodes kept, or None for a spare's ranks (its first rank said why)."""
    from ..screen import exchange as screening

    first = plan.workers[0].env.get("HPCTORCH_LOCAL_TASK_RANK", str(plan.workers[0].local_rank)) == "0"
    prefix = f"hpctorch/{plan.run_id}/screen/"
    store = screening.connect(plan, plan.rdzv_timeout, serve=plan.is_master and first)
    try:
        if first:
            outcome = screening.run(plan, store, args.screen_threshold, _uses_gpus(plan), prefix, plan.rdzv_timeout,
                                    spares=args.spare_nodes, listeners=plan.world_size - plan.nnodes)
        else:
            outcome = screening.verdict(plan, store, prefix, plan.rdzv_timeout + screening.BUDGET_S + screening.VERDICT_AFTER_S)
    finally:
        del store  # node 0's store leaves the master port to rank 0's own
    screening.report(plan, outcome, args.screen_threshold, args.screen or "warn", os.environ, speaks=first)
    kept = without_spares(args, plan, outcome, options, speaks=first) if args.spare_nodes else (plan, None)
    return kept[0] if kept is not None else None


def without_spares(args: argparse.Namespace, plan: Plan, screened, options: Options,  # type: ignore[no-untyped-def]
                   speaks: bool = True) -> tuple[Plan, Seat | None] | None:
    """--spare-nodes: this process's plan on the nodes kept, or None on a spare (said once per
    node, by the process that ``speaks`` for it). With --max-restarts (hot spares) every node
    also gets its seat, and a spare a plan of the kept nodes and the spares after them (a watchdog
    slot of its own), to wait in torch's rendezvous."""
    from ..plan.discover import plan_keeping
    from ..screen.exchange import host_of
    from ..start.spares import Seat

    if len(screened.spares) != args.spare_nodes or not screened.master:
        raise HpctorchError("node 0 did not say which nodes sit out (its verdict never came)",
                            "see node 0's output; rerun, or drop --spare-nodes")
    names = [plan.nodes[n] if n < len(plan.nodes) else host_of(screened, n) for n in range(plan.nnodes)]
    kept = [n for n in range(plan.nnodes) if n not in screened.spares]
    hot = plan.max_restarts > 0
    if plan.node_rank in screened.spares:
        why = "; ".join(f["detail"] if f["measure"] == "screen" else f"{f['measure']} {f['detail']}"
                        for f in screened.findings if f["node"] == plan.node_rank)
        if speaks:
            how = "waits as a hot spare" if hot else "sits out as a spare"
            print(f"hpctorch: {names[plan.node_rank]} {how} ({why or 'the slowest of the nodes screened'})", file=sys.stderr, flush=True)
        if not hot:
            return None
        waiting = plan_keeping(options, os.environ, [*kept, *screened.spares], screened.master, plan.master_port)
        return waiting, Seat(waiting, len(screened.spares), len(kept), spare=True, host=names[plan.node_rank])
    narrowed = plan_keeping(options, os.environ, kept, screened.master, plan.master_port)
    if narrowed.node_rank == 0 and speaks and not args.quiet:
        spares = ", ".join(names[n] for n in screened.spares)
        print(f"hpctorch: running on {len(kept)} of {plan.nnodes} nodes ({hostlist.display(tuple(names[n] for n in kept))}), "
              f"world size {narrowed.world_size}, master {narrowed.master_addr}; "
              + (f"hot spare: {spares} (takes the place of a node whose rank fails first)" if hot else f"spare: {spares}"),
              file=sys.stderr, flush=True)
    return narrowed, (Seat(narrowed, len(screened.spares), len(kept), spare=False, host=names[plan.node_rank]) if hot else None)


def to_summary(args: argparse.Namespace, plan: Plan, screened) -> None:  # type: ignore[no-untyped-def]
    """Every node's figures join node 0's --summary-json."""
    if screened is None or not args.summary_json or not plan.is_master or not os.path.isfile(args.summary_json):
        return
    import json

    with open(args.summary_json, encoding="utf-8") as handle:
        data = json.load(handle)
    data["screen"] = screened.as_dict()
    with open(args.summary_json, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2)
        handle.write("\n")


def _uses_gpus(plan: Plan) -> bool:
    return any(w.env.get("CUDA_VISIBLE_DEVICES") not in (None, "") or w.env.get("HPCTORCH_DEVICES") for w in plan.workers) and _cuda()


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())

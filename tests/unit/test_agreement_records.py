"""The agreement's records: the same size at 16 and 16,384 nodes (node 0 reads one per node),
and still precise enough to name what differs."""

from __future__ import annotations

import json

from hpctorch.guard import agreement
from hpctorch.plan.types import Plan


def _plan(nnodes: int, node: int = 0, nproc: int = 4, names: str = "nid{:05d}") -> Plan:
    return Plan(mode="per-node", scheduler="slurm", job_id="42", nodes=tuple(names.format(n) for n in range(nnodes)), node_rank=node,
                nproc_per_node=(nproc,) * nnodes, master_addr="198.18.0.1", master_port=29400, rdzv_backend="static",
                rdzv_timeout=60, run_id="r", iface="hsn0", simulated=False, max_restarts=0, workers=(), common_env={})


def test_a_record_does_not_grow_with_the_node_count() -> None:
    small, large = (len(json.dumps(agreement.record(_plan(n)))) for n in (16, 16384))
    assert large - small <= 12, (small, large)  # a few digits more (node count, world size), not a list
    assert agreement.record(_plan(16384))["nodes"] == "nid[00000-16383]"
    assert agreement.record(_plan(16384))["nproc_per_node"] == "4x16384"


def test_names_no_hostlist_can_hold_become_a_digest_that_still_differs() -> None:
    odd = _plan(4096, names="host-{}.a,b")  # a comma: no hostlist can hold these names
    mine, theirs = agreement.record(odd), agreement.record(_plan(4096, names="host-{}.a;b"))
    assert len(mine["nodes"]) < 120 and "digest" in mine["nodes"] and mine["nodes"] != theirs["nodes"]
    assert agreement.differences({0: mine, 1: theirs}) and not agreement.differences({0: mine, 1: agreement.record(odd)})


def test_differing_counts_per_node_are_named() -> None:
    uneven = Plan(**{**_plan(4).__dict__, "nproc_per_node": (4, 4, 2, 4)})
    lines = agreement.differences({0: agreement.record(_plan(4)), 1: agreement.record(uneven)})
    host = agreement.record(_plan(4))["host"]
    assert lines == [f"processes per node: node 0 ({host}) 4x4, node 1 ({host}) 4x2,2x1,4x1",
                     f"world size: node 0 ({host}) 16, node 1 ({host}) 14"]

"""Kubernetes with Kubeflow's PyTorchJob (training-operator docs, "PyTorchJob"): each pod
gets MASTER_ADDR, MASTER_PORT, WORLD_SIZE = pods and RANK = this pod's index, or the
PET_* variables (PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT) meant for
torchrun. Either way one pod is one node; hpctorch starts the workers in it."""

from __future__ import annotations

from collections.abc import Mapping

from .allocation import Allocation, Launcher

LAUNCHER = Launcher("kubeflow")
from ._parse import check_rank, env_int


def detect(env: Mapping[str, str]) -> Allocation | None:
    if not env.get("KUBERNETES_SERVICE_HOST") or env.get("TORCHELASTIC_RUN_ID") or env.get("LOCAL_RANK"):
        return None
    prefix = "PET_" if env.get("PET_NNODES") else ""
    count_var, rank_var = (f"{prefix}NNODES", f"{prefix}NODE_RANK") if prefix else ("WORLD_SIZE", "RANK")
    nnodes = env_int(env, count_var, minimum=1)
    node = env_int(env, rank_var)
    address = env.get(f"{prefix}MASTER_ADDR")
    if nnodes is None or node is None or not address:
        return None
    check_rank(rank_var, node, count_var, nnodes)
    return Allocation(
        launcher=LAUNCHER, tasks_per_node=(1,) * nnodes, task_rank=node, node_rank=node, local_task_rank=0,
        master_addr=address, master_port=env_int(env, f"{prefix}MASTER_PORT", minimum=1),
        sources={"tasks_per_node": count_var, "node_rank": rank_var, "master_addr": f"{prefix}MASTER_ADDR", "master_port": f"{prefix}MASTER_PORT"},
    )

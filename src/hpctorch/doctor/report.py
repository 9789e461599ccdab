"""What one node says about itself to the doctor, before talking to anyone: versions,
interfaces, the plan's choices, GPUs, container, the shared directory."""

from __future__ import annotations

import os
import platform
import socket
from collections.abc import Mapping

from .. import __version__
from ..guard import agreement
from ..host import containers, network
from ..host.facts import resolve
from ..plan.types import Plan

ENV_PREFIXES = ("NCCL_", "GLOO_", "MASTER_", "TORCH_NCCL", "CUDA_VISIBLE", "HPCTORCH_", "FI_", "UCX_")


def _versions() -> dict[str, object]:
    import torch

    versions: dict[str, object] = {"python": platform.python_version(), "torch": torch.__version__.split("+")[0],
                                   "hpctorch": __version__, "cuda": torch.version.cuda, "nccl": None}
    if torch.cuda.is_available():
        try:
            versions["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001 - a build without NCCL
            pass
    return versions


def local_report(plan: Plan | None, plan_error: str | None, env: Mapping[str, str]) -> dict[str, object]:
    """What this node knows about itself, before talking to anyone."""
    from ..host.devices import gpus

    interfaces = network.list_interfaces()
    host = socket.gethostname()
    chosen = next((i for i in interfaces if plan and i.name == plan.iface), None)
    return {
        "node": plan.node_rank if plan else None,
        "host": host,
        "plan_error": plan_error,
        "versions": _versions(),
        "agreement": agreement.record(plan) if plan else None,
        "iface": plan.iface if plan else None,
        "iface_reason": plan.reasons.get("iface", "") if plan else "",
        "address": chosen.address if chosen else (plan.master_addr if plan and plan.is_master else None),
        "interfaces": [{"name": i.name, "addresses": [str(a) for a in i.ipv4 + i.ipv6], "up": i.is_up} for i in interfaces],  # type: ignore[operator]
        "resolves": list(resolve(host)),
        "gpus": {"visible": env.get("CUDA_VISIBLE_DEVICES"), "count": len(gpus(env))},
        "env": {k: v for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES)},
        "master": {"addr": plan.master_addr, "port": plan.master_port} if plan else None,
        "container": containers.detect(env),
        "shared_dir": _shared_dir(plan),
        "infiniband": {"interfaces": [i.name for i in interfaces if i.name.startswith("ib")],
                       "devices": os.path.isdir("/dev/infiniband")},
    }


def _shared_dir(plan: Plan | None) -> dict[str, object] | None:
    """The directory the nodes share (rendezvous, agreement): is it there, writable?"""
    if plan is None or not plan.agreement_dir:
        return None
    shared = os.path.dirname(os.path.dirname(plan.agreement_dir))  # <dir>/.hpctorch/<key>.agreement
    return {"path": shared, "visible": os.path.isdir(shared), "writable": os.access(shared, os.W_OK)}


def port_holder(port: int) -> str | None:
    try:
        import psutil

        for conn in psutil.net_connections("tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                return f"pid {conn.pid} ({psutil.Process(conn.pid).name()})"
    except Exception:  # noqa: BLE001 - best effort: needs privileges to see others' sockets
        return None
    return None

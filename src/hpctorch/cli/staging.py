"""``run --stage-env`` from the command line: the settings, checked before anything starts, and
this node's part once the nodes that run are known."""

from __future__ import annotations

import argparse
import os
import sys
import time

from .. import listed_imports
from ..errors import HpctorchError
from ..plan.types import Plan


def settings(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The settings, or None without --stage-env; a bad value is one line before anything starts."""
    if not args.stage_env:
        listed_imports.uninstall()
        return None
    from ..stage.node import Settings

    return Settings.of(args.stage_env == "try", args.stage_paths, args.stage_dir, os.environ)


def check_mode(args: argparse.Namespace, plan: Plan) -> None:
    if args.stage_env and plan.mode == "unchanged":
        raise HpctorchError(f"--stage-env needs hpctorch to start the workers, and this is an {plan.mode} run "
                            f"({plan.reasons.get('mode', 'every variable set by the launcher')})",
                            "start hpctorch run with srun, mpirun or on each node instead of under torchrun")


def stage(args: argparse.Namespace, plan: Plan, chosen) -> None:  # type: ignore[no-untyped-def]
    """This node's part; afterwards every process it starts runs from its copy (``hpctorch.staged``)."""
    if chosen is None:
        return
    from .. import timings
    from ..stage.node import open_store
    from ..stage.node import stage as stage_node

    started = time.monotonic()
    if plan.node_rank == 0 and (plan.nnodes == 1 or plan.simulated) and not args.quiet:
        _say_if_local()
    # Per task, each node's first rank takes the node's part; the node's other ranks use its copy.
    first = plan.mode != "per-task" or plan.workers[0].env.get("HPCTORCH_LOCAL_TASK_RANK", str(plan.workers[0].local_rank)) == "0"
    listeners = plan.world_size - plan.nnodes if plan.mode == "per-task" else 0
    try:
        copy = stage_node(plan, chosen, lambda: open_store(plan, plan.is_master and first), first, listeners)
    finally:
        listed_imports.uninstall()  # the copy's paths, or the shared ones under =try, are imported the usual way from here
    timings.mark("environment staged")
    if copy is None:
        return
    copy.export(os.environ)  # type: ignore[arg-type]
    if plan.mode != "per-task":
        copy.adopt()  # what this process imports from now on (torch's agent: torch) comes from the copy too
    if plan.node_rank == 0 and first and not args.quiet:
        print(f"hpctorch: the workers run from a copy of {', '.join(copy.copies)} on each node's own disk "
              f"({os.path.dirname(next(iter(copy.copies.values())))}, {time.monotonic() - started:.1f} s)", file=sys.stderr, flush=True)


def _say_if_local() -> None:
    """One machine whose environment is on its own disk: the copy costs a pack and its space, and spares nothing."""
    from ..host.folders import NETWORK_FILE_SYSTEMS, file_system_of

    kind = file_system_of(sys.prefix)
    if kind is not None and kind not in NETWORK_FILE_SYSTEMS:
        print(f"hpctorch: --stage-env on one machine whose environment ({sys.prefix}) is on its own disk ({kind}): the copy "
              "gains nothing here (the first run packs and copies it); it pays off where many nodes import from a shared "
              "file system", file=sys.stderr, flush=True)

"""``run --stage-env`` from the command line: the settings, checked before anything starts, and
this node's part once the nodes that run are known."""

from __future__ import annotations

import argparse
import os
import sys
import time

from ..errors import HpctorchError
from ..plan.types import Plan


def settings(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The settings, or None without --stage-env; a bad value is one line before anything starts."""
    if not args.stage_env:
        return None
    from ..stage.node import Settings

    return Settings.of(args.stage_env == "try", args.stage_paths, args.stage_dir, os.environ)


def check_mode(args: argparse.Namespace, plan: Plan) -> None:
    if args.stage_env and plan.mode in ("per-task", "unchanged"):
        raise HpctorchError(f"--stage-env needs one hpctorch per node, and this is a {plan.mode} run "
                            f"({plan.reasons.get('mode', 'every rank started by the launcher')})",
                            "start one hpctorch per node (e.g. srun --ntasks-per-node=1 hpctorch run --nproc-per-node N --stage-env ...)")


def stage(args: argparse.Namespace, plan: Plan, chosen) -> None:  # type: ignore[no-untyped-def]
    """This node's part; afterwards every process it starts runs from its copy (``hpctorch.staged``)."""
    if chosen is None:
        return
    from .. import timings
    from ..guard.screen import connect
    from ..stage.node import stage as stage_node

    started = time.monotonic()
    copy = stage_node(plan, chosen, lambda: connect(plan, plan.rdzv_timeout, what="staging the environment"))
    timings.mark("environment staged")
    if copy is None:
        return
    copy.export(os.environ)  # type: ignore[arg-type]
    if plan.starter == "torch" and not plan.simulated:
        copy.adopt()  # torch's agent imports torch in this process
    if plan.node_rank == 0 and not args.quiet:
        print(f"hpctorch: the workers run from a copy of {', '.join(copy.copies)} on each node's own disk "
              f"({os.path.dirname(next(iter(copy.copies.values())))}, {time.monotonic() - started:.1f} s)", file=sys.stderr, flush=True)

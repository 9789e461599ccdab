"""A worker's side of the nodes' agreement when hpctorch starts the workers on several nodes
(``supervisor``): no collective runs before every node planned the same job.

``init_process_group`` is wrapped as torch loads it (``c10dhook``). In local rank 0 of each node
(``AGREEMENT_ENV``: the node's plan as JSON) it first runs ``agreement.check``; on node 0 that
process is rank 0, and the store the check serves is the one torch's env:// then reuses
(multi-tenant, at MASTER_PORT), as under torch's agent. The outcome goes to the node's result
file (``RESULT_ENV``): "" or the error as JSON, which the other local ranks wait for and the
supervisor reads. A worker whose node disagreed exits with status 2 before any collective.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time

AGREEMENT_ENV = "HPCTORCH_AGREEMENT"
RESULT_ENV = "HPCTORCH_AGREED"
WAIT_ENV = "HPCTORCH_AGREED_WAIT"
EXIT_CODE = 2
POLL_S = 0.02
_state: dict = {}


def install() -> None:
    from ..c10dhook import after_load

    after_load(_wrap)


def _wrap(module) -> None:  # type: ignore[no-untyped-def]
    init = module.init_process_group

    @functools.wraps(init)
    def init_process_group(*args, **kwargs):  # type: ignore[no-untyped-def]
        agree()
        return init(*args, **kwargs)

    module.init_process_group = init_process_group


def agree() -> None:
    """Once per process: check (local rank 0) or wait for the node's outcome; exit on a failure."""
    if "outcome" in _state:
        return
    result = os.environ[RESULT_ENV]
    if os.environ.get(AGREEMENT_ENV):
        _state["outcome"] = outcome = _check(os.environ[AGREEMENT_ENV])
        _write(result, outcome)
    else:
        _state["outcome"] = outcome = _wait(result, float(os.environ.get(WAIT_ENV, "900")))
    if outcome:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_CODE)  # not SystemExit: the script's own handlers must not carry on
    from ..timings_worker import mark

    mark("worker: agreement done")


def _check(plan_file: str) -> str:
    from ..errors import HpctorchError
    from ..plan.types import Plan
    from . import agreement

    with open(plan_file, encoding="utf-8") as source:
        plan = Plan.from_dict(json.load(source))
    try:
        _state["store"] = agreement.check(plan, plan.rdzv_timeout)  # node 0: held for torch's env://
    except HpctorchError as exc:
        return json.dumps({"cause": exc.cause, "fix": exc.fix})
    return ""


def _write(path: str, outcome: str) -> None:
    from ..host.folders import replace_file

    replace_file(path, outcome)


def _wait(path: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(path, encoding="utf-8") as source:
                return source.read()
        except FileNotFoundError:
            time.sleep(POLL_S)
    return json.dumps({"cause": f"local rank 0 did not check the nodes' agreement within {timeout_s:.0f} s",
                       "fix": "make every rank call init_process_group"})


def read(path: str) -> dict | None:
    """The supervisor's view: None while unknown or agreed, else the error (cause, fix)."""
    try:
        with open(path, encoding="utf-8") as source:
            text = source.read()
    except OSError:
        return None
    return json.loads(text) if text else None

"""A worker's side of ``--timings`` (started by ``_worker.py`` when HPCTORCH_TIMINGS is set):
when Python was up, when ``init_process_group`` was called and returned, when the first
collective called from Python returned (DDP's own run in C++ and are not seen). torch is not
imported here: ``torch.distributed.distributed_c10d`` is wrapped as it loads (``c10dhook``). Each rank then
sends one record through the job's store; rank 0 collects them (bounded) and prints the table.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import threading
import time

from .terminal import printable
from .timings import ENV, table

COLLECTIVES = ("all_reduce", "broadcast", "barrier", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
               "all_to_all_single", "reduce", "gather", "scatter", "all_gather_object", "broadcast_object_list")
WAIT_S = 10.0
_state: dict = {}


def mark(stage: str) -> None:
    """Note a stage of this worker's startup (nothing without ``--timings``)."""
    if "marks" in _state:
        _mark(stage)


def _mark(stage: str) -> None:
    if not any(name == stage for name, _ in _state["marks"]):
        _state["marks"].append((stage, round(time.time() - _state["t0"], 3)))


def _wrap(module) -> None:  # type: ignore[no-untyped-def]
    init = module.init_process_group

    @functools.wraps(init)
    def init_process_group(*args, **kwargs):  # type: ignore[no-untyped-def]
        _mark("worker: rendezvous reached")
        result = init(*args, **kwargs)
        _mark("worker: rendezvous done")
        _state["store"] = module._get_default_store()
        threading.Thread(target=_report, args=(module,), daemon=True).start()
        return result

    module.init_process_group = init_process_group
    destroy = module.destroy_process_group

    @functools.wraps(destroy)
    def destroy_process_group(*args, **kwargs):  # type: ignore[no-untyped-def]
        _flush()  # the record goes through the store this tears down
        return destroy(*args, **kwargs)

    module.destroy_process_group = destroy_process_group
    for name in COLLECTIVES:
        original = getattr(module, name, None)
        if original is not None:
            setattr(module, name, _first(original))


def _first(collective):  # type: ignore[no-untyped-def]
    @functools.wraps(collective)
    def call(*args, **kwargs):  # type: ignore[no-untyped-def]
        result = collective(*args, **kwargs)
        if not _state["collective"].is_set():
            _mark("worker: first collective done")
            _state["collective"].set()
        return result

    return call


def _report(module) -> None:  # type: ignore[no-untyped-def]
    """After the first collective (or WAIT_S without one): one record; rank 0 prints them all."""
    _state["collective"].wait(WAIT_S)
    store, rank = _state["store"], int(os.environ.get("RANK", "0"))
    try:
        store.set(f"hpctorch/timings/{rank}", json.dumps({**_state["info"], "rank": rank, "marks": _state["marks"]}))
        store.add("hpctorch/timings/count", 1)
        if rank != 0:
            return
        world = int(os.environ.get("WORLD_SIZE", "1"))
        deadline = time.monotonic() + WAIT_S
        while store.add("hpctorch/timings/count", 0) < world and time.monotonic() < deadline:
            time.sleep(0.1)
        keys = [f"hpctorch/timings/{r}" for r in range(world)]
        records = [json.loads(v) for v in store.multi_get(keys)] if store.check(keys) else []
        if records:
            print(printable("\n".join(table(records))), file=sys.stderr, flush=True)
    except Exception as exc:  # noqa: BLE001 - only the report is lost; the job is not disturbed
        if os.environ.get("HPCTORCH_DEBUG"):
            print(f"hpctorch --timings: {exc!r}", file=sys.stderr)
    finally:
        _state["done"].set()


def install() -> None:
    info = json.loads(os.environ[ENV])
    _state.update(t0=info["t0"], info={"node": info["node"], "host": info["host"]}, marks=[*map(tuple, info["marks"])],
                  collective=threading.Event(), done=threading.Event())
    _mark("worker: Python up")
    from .c10dhook import after_load

    after_load(_wrap)
    atexit.register(_flush)


def _flush() -> None:
    """A script may end right after its first collective: send the record before the store
    or the interpreter goes (rank 0, which serves the store, also waits for the others,
    bounded). Called at destroy_process_group and at exit."""
    if "store" in _state:
        _state["collective"].set()
        _state["done"].wait(WAIT_S + 2)

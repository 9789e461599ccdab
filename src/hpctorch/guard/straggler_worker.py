"""A worker's side of the straggler watch (``--stragglers``, on by default): how long this rank
spends inside collectives, with no change to the script.

A rank that computes slower than the others arrives last at every collective and waits for
nobody; the others wait inside it for that rank. So each rank's share of time inside
collectives is the signal (``guard.stragglers`` judges it). Measured where torch offers it:

- NCCL: torch's flight recorder, read every publish (``_dump_nccl_trace``, without stacks): each
  retired entry's ``duration_ms`` comes from CUDA events around the collective
  (``TORCH_NCCL_ENABLE_TIMING``, set here unless the user set it). It sees every collective of
  every group, DDP's C++ reducer, FSDP2 and functional collectives alike, in GPU time, never host
  timestamps of launches. (torch's completion hook gives the same figure, but one Python call per
  collective, and prints in every rank that it "will be deprecated in favor of Flight Recorder".)
  The recorder is on by default (``TORCH_FR_BUFFER_SIZE``: a ring of 2,000 entries); entries it
  dropped between two reads count at the mean duration of those read.
- gloo: torch has no completion hook for gloo (it raises "Only ProcessGroupNCCL supports
  onCompletion hook") and its flight recorder keeps no completion time for gloo, so the host
  times each call from its issue to its completion (its future's callback, on gloo's thread):
  the collectives of ``torch.distributed`` (wrapped as torch loads them, ``c10dhook``: plain
  calls, FSDP2's) and, for DDP, whose C++ reducer calls gloo directly, torch's documented
  equivalent of its built-in allreduce (``default_hooks.allreduce_hook``, its one callback also
  noting the time) as the comm hook. A hook the user registers later takes its place (forwarded:
  the reducer accepts one registration); its collectives are timed as plain calls.

Every ``PUBLISH_S`` a thread writes this rank's running totals (``t``: monotonic now, ``inside_s``,
``count``, its global ``rank``: torch's rendezvous may number the nodes, its ``pid``: the node
reads its cgroup's CPU throttling, and ``first``: when its first collective completed, written at
once then, from which torch's agent learns that an attempt trained, ``start.attempts``, and the
goodput when training began, ``guard.goodput``) to
``<HPCTORCH_STRAGGLERS_DIR>/<local rank>.json``, a private folder of the node's, which the node's
watchdog reads: no store traffic from a worker.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable

DIR_ENV = "HPCTORCH_STRAGGLERS_DIR"
PUBLISH_S = 5.0
COLLECTIVE = re.compile(r"all_\w+|reduce(_scatter\w*)?|broadcast\w*|gather\w*|scatter\w*|barrier|monitored_barrier")
"""torch.distributed's collectives timed on the host: every public function so named, whatever the
torch (2.13's FSDP2 calls ``all_gather_single`` and ``reduce_scatter_single``, new there). Nested
ones (all_gather_object's all_gather) count once: the time inside is a union of intervals."""


class Meter:
    """This rank's time inside collectives: host intervals (merged, so overlapping asynchronous
    ones count once) and device durations (summed: a group's collectives run one after another
    on its stream)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._intervals: list[tuple[float, float]] = []
        self._open: dict[int, float] = {}
        """Host collectives under way (their start by a token): a rank stuck inside one counts it."""
        self._device_s = 0.0
        self.count = 0
        self.inside_s = 0.0
        self.first: float | None = None
        """When (monotonic: one clock for the node's processes) the first collective completed (not
        one that raised): this attempt reached training."""
        self.on_progress: Callable[[], object] | None = None
        """Called then, in the thread that saw it complete (the rank's file is written at once)."""
        self._cut = time.monotonic()
        self._tokens = 0

    def begin(self, start: float) -> int:
        with self._lock:
            self._tokens += 1
            self._open[self._tokens] = start
            return self._tokens

    def interval(self, start: float, end: float, token: int | None = None, completed: bool = True) -> None:
        with self._lock:
            self._intervals.append((start, end))
            self.count += 1
            if token is not None:
                self._open.pop(token, None)
        if completed and self.first is None:
            self.first = end
            if self.on_progress is not None:
                self.on_progress()

    def duration(self, seconds: float, count: int = 1) -> None:
        with self._lock:
            self._device_s += max(0.0, seconds)
            self.count += count
        if count and self.first is None:
            self.first = time.monotonic()

    def totals(self, now: float) -> dict[str, float]:
        """Running totals up to ``now``: the finished intervals since the last call, clipped to
        start there, merged and added."""
        with self._lock:
            intervals, self._intervals = self._intervals, []
            device, self._device_s = self._device_s, 0.0
            cut, self._cut = self._cut, now
            count = self.count + len(self._open)
            # Under way: counted up to now; once finished, only its part after this cut is added.
            intervals += [(start, now) for start in self._open.values()]
        self.inside_s += device + merged_length(intervals, cut)
        return {"t": now, "inside_s": self.inside_s, "count": count, "rank": int(os.environ.get("RANK", "0") or 0), "pid": os.getpid(),
                "first": self.first}


def merged_length(intervals: list[tuple[float, float]], since: float) -> float:
    """The length of the union of ``intervals``, each clipped to start at ``since``."""
    total, reach = 0.0, since
    for start, end in sorted(intervals):
        start = max(start, reach)
        if end > start:
            total += end - start
            reach = end
    return total


METER = Meter()
_state: dict = {}
_writing = threading.Lock()


def install() -> None:
    """In the worker entry, before the script: time collectives once torch loads them."""
    from ..c10dhook import after_load

    os.environ.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")  # before any NCCL group exists
    after_load(_wrap)


def _wrap(module) -> None:  # type: ignore[no-untyped-def]
    _state["all_reduce"] = module.all_reduce
    for name in getattr(module, "__all__", ()):
        found = module.__dict__.get(name)  # never getattr: a deprecated name (reduce_op) warns when read
        if COLLECTIVE.fullmatch(name) and inspect.isfunction(found):
            setattr(module, name, _host_timed(found))
    init = module.init_process_group

    @functools.wraps(init)
    def init_process_group(*args, **kwargs):  # type: ignore[no-untyped-def]
        result = init(*args, **kwargs)
        _started(module)
        return result

    module.init_process_group = init_process_group


def _host_timed(collective):  # type: ignore[no-untyped-def]
    @functools.wraps(collective)
    def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
        if _on_device(args, kwargs):
            return collective(*args, **kwargs)  # NCCL's flight recorder times it on the device
        start = time.monotonic()
        token = METER.begin(start)
        try:
            work = collective(*args, **kwargs)
        except BaseException:
            METER.interval(start, time.monotonic(), token, completed=False)
            raise
        if work is None or not hasattr(work, "get_future"):
            METER.interval(start, time.monotonic(), token)
        else:
            try:
                work.get_future().add_done_callback(lambda _done: METER.interval(start, time.monotonic(), token))
            except Exception:  # noqa: BLE001 - a backend without futures: counted as finished now
                METER.interval(start, time.monotonic(), token)
        return work

    return timed


def _on_device(args: tuple, kwargs: dict) -> bool:
    """Whether the collective's first tensor lives on an accelerator."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, (list, tuple)) and value:
            value = value[0]
        device = getattr(value, "device", None)
        if device is not None and hasattr(value, "is_cuda"):
            return device.type != "cpu"
    return False


def _started(module) -> None:  # type: ignore[no-untyped-def]
    """After the default group exists: DDP's reducer timed, NCCL's recorder found, the writer."""
    if _state.get("started"):
        return
    _state["started"] = True
    _time_ddp_reducer()
    _state["recorder"] = _device_recorder(module)
    directory = os.environ.get(DIR_ENV)
    if directory:
        import atexit

        path = os.path.join(directory, f"{os.environ.get('LOCAL_RANK', '0')}.json")
        # The agent reads from it that this attempt trained (start.attempts), and what a warm
        # standby for this local rank imports (start.standby).
        METER.on_progress = lambda: (_publish(path), _write_modules(directory))
        threading.Thread(target=_publish_loop, args=(path,), name="hpctorch-stragglers", daemon=True).start()
        atexit.register(_publish, path)  # the last seconds too, for the closing summary
        if os.environ.get("HPCTORCH_STRAGGLERS_NODE"):  # per task: this rank is its node's side of the watch
            threading.Thread(target=_node_loop, args=(module, directory), name="hpctorch-stragglers-node", daemon=True).start()


def modules_file(directory: str, local_rank: str | int) -> str:
    """Where local rank ``local_rank``'s worker names the modules it imported (``_write_modules``)."""
    return os.path.join(directory, f"{local_rank}.modules")


def _write_modules(directory: str) -> None:
    """The installed packages' modules this rank imported by its first collective (the script's
    own and the standard library's left out), one name a line: what its standby imports ahead."""
    from ..host.folders import replace_file

    names = sorted(name for name, module in list(sys.modules.items())
                   if "-packages" in (getattr(module, "__file__", None) or "") and not name.startswith("hpctorch"))
    try:
        replace_file(modules_file(directory, os.environ.get("LOCAL_RANK", "0")), "\n".join(names) + "\n")
    except OSError:
        pass


def _device_recorder(module):  # type: ignore[no-untyped-def]
    """torch's NCCL flight-recorder dump, when the job has an NCCL group."""
    try:
        if "nccl" not in str(module.get_backend()):
            return None
        from torch._C import _distributed_c10d

        return getattr(_distributed_c10d, "_dump_nccl_trace", None)
    except Exception:  # noqa: BLE001 - no NCCL here: host timing only
        return None


def _device_durations() -> None:
    """The NCCL collectives retired since the last read, from the flight recorder."""
    dump = _state.get("recorder")
    if dump is None:
        return
    import pickle

    try:
        entries = pickle.loads(dump(includeCollectives=True, includeStackTraces=False, onlyActive=False)).get("entries", [])
    except Exception:  # noqa: BLE001 - a torch whose dump differs: no device timing
        _state["recorder"] = None
        return
    last, read, dropped = _state.get("seen", -1), [], 0
    for entry in sorted(entries, key=lambda e: e.get("record_id", -1)):
        record = entry.get("record_id", -1)
        if record <= last:
            continue
        if not entry.get("retired"):
            break  # this one and later ones at the next read
        if last >= 0 and record > last + 1:
            dropped += record - last - 1  # overwritten in the ring before this read
        last = record
        if entry.get("duration_ms") is not None:
            read.append(entry["duration_ms"] / 1000.0)
    _state["seen"] = last
    for seconds in read:
        METER.duration(seconds)
    if dropped and read:
        METER.duration(sum(read) / len(read) * dropped, count=dropped)


def _time_ddp_reducer() -> None:
    """DDP on the CPU with gloo: torch's documented equivalent of the built-in allreduce as the
    comm hook, so the reducer's collectives are timed; the user's own hook, registered before
    or after, is what runs."""
    from torch.nn.parallel import distributed as ddp_module

    ddp = ddp_module.DistributedDataParallel
    if getattr(ddp, "_hpctorch_timed", False):
        return
    ddp._hpctorch_timed = True
    original_init, original_register, original_builtin = ddp.__init__, ddp.register_comm_hook, ddp._register_builtin_comm_hook

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        original_init(self, *args, **kwargs)
        if getattr(self, "_hpctorch_hook", None) is None and _host_reduced(self):
            self._hpctorch_hook = None
            original_register(self, None, _forward_hook(self))
            self._hpctorch_forwarding = True

    @functools.wraps(original_register)
    def register_comm_hook(self, state, hook):  # type: ignore[no-untyped-def]
        if not getattr(self, "_hpctorch_forwarding", False):
            self._hpctorch_hook = (state, hook)
            return original_register(self, state, hook)
        self._check_comm_hook(hook)
        self.logger._set_comm_hook_name(hook.__qualname__)
        self._comm_hooks.append((hook, state))
        self._hpctorch_hook = (state, hook)

    @functools.wraps(original_builtin)
    def _register_builtin_comm_hook(self, comm_hook_type):  # type: ignore[no-untyped-def]
        if not getattr(self, "_hpctorch_forwarding", False):
            self._hpctorch_hook = (None, None)
            return original_builtin(self, comm_hook_type)
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        hook = default_hooks.fp16_compress_hook if "FP16" in str(comm_hook_type) else default_hooks.allreduce_hook
        self.logger._set_comm_hook_name(str(comm_hook_type))
        self._hpctorch_hook = (self.process_group, hook)

    ddp.__init__, ddp.register_comm_hook, ddp._register_builtin_comm_hook = __init__, register_comm_hook, _register_builtin_comm_hook


def _host_reduced(ddp) -> bool:  # type: ignore[no-untyped-def]
    import torch.distributed as dist

    try:
        return ddp.device_type == "cpu" and dist.get_backend(ddp.process_group) == "gloo" and hasattr(ddp, "reducer")
    except Exception:  # noqa: BLE001 - not timed rather than in the way
        return False


def _forward_hook(ddp):  # type: ignore[no-untyped-def]
    import torch.distributed as dist

    untimed = _state["all_reduce"]

    def hpctorch_timed_allreduce(state, bucket):  # type: ignore[no-untyped-def]
        chosen = ddp.__dict__.get("_hpctorch_hook")
        if chosen is not None:
            return chosen[1](chosen[0], bucket)
        # torch's default_hooks.allreduce_hook, its one callback also noting the time: a Python
        # callback per bucket is this path's whole cost (benchmark 9).
        group = ddp.process_group if ddp.process_group is not None else dist.group.WORLD
        tensor = bucket.buffer()
        tensor.div_(group.size())
        start = time.monotonic()

        def reduced(future):  # type: ignore[no-untyped-def]
            METER.interval(start, time.monotonic())
            return future.value()[0]

        return untimed(tensor, group=group, async_op=True).get_future().then(reduced)

    return hpctorch_timed_allreduce


def _node_loop(module, directory: str) -> None:  # type: ignore[no-untyped-def]
    """Per task, in each node's local rank 0: what a node's watchdog does per node (its ranks'
    files into one record, node 0 judging all), through the job's own store (torch's default
    group's, which rank 0 serves; one node needs none): there is no hpctorch process beside the
    ranks. A line is this rank's output; per task there is no closing summary."""
    from .stragglers import Settings, Watch, plan_of_task

    try:
        settings = Settings.from_env(os.environ)
        plan = plan_of_task(os.environ["HPCTORCH_STRAGGLERS_NODE"])
        store = module._get_default_store() if plan.nnodes > 1 else None  # one node: judged here, no store
    except Exception:  # noqa: BLE001 - no watch rather than a failing rank
        return
    if settings is None:
        return
    watch = Watch(plan, settings, directory)
    try:
        if store is not None:
            watch.announce(store)
    except Exception:  # noqa: BLE001 - the store went away: the job is ending
        return
    failures = 0
    while failures < 3:  # three in a row: the store went away (rank 0 ended), the job is ending
        time.sleep(settings.publish_s)
        try:
            watch.step(store, time.monotonic())
            failures = 0
        except Exception:  # noqa: BLE001 - a store request that failed once is tried at the next step
            failures += 1


def _publish_loop(path: str) -> None:
    try:  # six files a window: the node's record then spans about the window it names
        every = min(PUBLISH_S, float(os.environ.get("HPCTORCH_STRAGGLER_WINDOW_S") or 30) / 6)
    except ValueError:
        every = PUBLISH_S
    while True:
        time.sleep(every)
        if not _publish(path):
            return  # the node's folder is gone: the job is ending


def _publish(path: str) -> bool:
    from ..host.folders import replace_file

    with _writing:  # the thread's and the exit's
        _device_durations()
        try:
            replace_file(path, json.dumps(METER.totals(time.monotonic())))
        except OSError:
            return False
    return True

"""Every worker's first moment: ``python -u _worker.py [-m] TARGET ARGS...`` runs a Python
script or module in this process as ``python`` would; ``python _worker.py --exec CMD ARGS...``
execs any other command. Before that it

- gives worker LOCAL_RANK its own CPUs (sched_setaffinity, before torch starts a thread),
  HPCTORCH_CPUS, HPCTORCH_DEVICES and OMP_NUM_THREADS from the plan's per-node lists
  (per-node mode: torch's agent starts every local worker with one environment);
- in a rank other than 0 whose env:// rendezvous would race rank 0 creating its store, waits
  for that store to listen before torch's client tries (``storewait``: torch's retry sleeps
  0.25-0.75 s and more);
- with HPCTORCH_TIMINGS set (``--timings``), notes this worker's startup stages;
- with HPCTORCH_FILE_STORE set (``--rdzv-backend file``), points env:// at that FileStore;
- with HPCTORCH_AGREED set (several nodes started by hpctorch), checks that the nodes agree
  before ``init_process_group`` (``agreement_worker``);
- with HPCTORCH_STRAGGLERS_DIR set (the straggler watch), times its collectives
  (``straggler_worker``);
- under ``--stage-env`` (HPCTORCH_STAGED names a copy with room for a record), records what it
  reads of the copy (``stage.hotrecord``): the hot set node 0's later packs carry;
- with HPCTORCH_STACKS_DIR set, has Python's faulthandler write every thread's stack to
  ``DIR/<pid>.stack`` on ``STACK_SIGNAL``: ``hpctorch stacks`` then works where ptrace (py-spy)
  is not allowed. The file exists only once the handler is in place, so a process is never
  sent the signal before it can take it.

Run as a file (its path is stable: running jobs' command lines name it) it imports only
``hpctorch.host.cpulist`` and ``hpctorch.start.storewait`` (and faulthandler, runpy: built in),
and what the settings above ask for (``host.folders``/``host.signals`` for the faulthandler
fallback, torch's FileStore for the file backend).
"""

from __future__ import annotations

import os
import sys

_kept: list[object] = []  # the open dump file must live as long as the process


def _apply_lists() -> None:
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    cpu_sets = os.environ.get("HPCTORCH_CPU_SETS", "").split(";")
    device_sets = os.environ.get("HPCTORCH_DEVICE_SETS", "").split(";")
    threads = os.environ.get("HPCTORCH_THREAD_COUNTS", "").split(",")
    if rank < len(cpu_sets) and cpu_sets[rank]:
        from hpctorch.host.cpulist import bind_to

        bind_to(cpu_sets[rank])
        os.environ["HPCTORCH_CPUS"] = cpu_sets[rank]
    if rank < len(device_sets) and device_sets[rank]:
        os.environ["HPCTORCH_DEVICES"] = device_sets[rank]
    if rank < len(threads) and threads[rank]:
        os.environ["OMP_NUM_THREADS"] = threads[rank]


def _register_stack_dump(warm: bool) -> None:
    directory = os.environ.get("HPCTORCH_STACKS_DIR")
    if not directory:
        return
    import atexit

    from hpctorch.host.folders import RANK_KEYS, create_private_file, rank_file, replace_file, stack_file
    from hpctorch.host.signals import STACK_SIGNAL

    if warm:  # where the stacks' readers find its rank: its /proc environ predates its attempt
        import json

        told = rank_file(directory, os.getpid())
        try:  # 0600, never through a link, whole or not at all; a dead worker's of the same pid is replaced
            replace_file(told, json.dumps({key: os.environ[key] for key in RANK_KEYS if key in os.environ}))
            atexit.register(_remove, told)
        except OSError:
            pass
    if STACK_SIGNAL is None:
        return
    import faulthandler

    path = stack_file(directory, os.getpid())
    try:  # 0600, never through a link; a dead worker's file of the same pid is replaced
        if os.path.lexists(path):
            os.remove(path)
        dump = open(create_private_file(path), "a", encoding="utf-8")  # noqa: SIM115 - kept open
    except OSError:
        return  # no fallback for this worker; py-spy may still read it
    faulthandler.register(STACK_SIGNAL, file=dump, all_threads=True, chain=False)
    _kept.append(dump)
    atexit.register(_remove, path)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _run_python(argv: list[str]) -> None:
    import runpy

    if argv[0] == "-m":
        sys.argv = argv[1:]
        sys.path[0] = os.getcwd()  # as python -m does; not this file's directory
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        # As python does for a script: its own (real) directory first, so the user's modules
        # are found and hpctorch's (plan.py, network.py...) never shadow them.
        sys.path[0] = os.path.dirname(os.path.realpath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


def main() -> None:
    if os.environ.get("HPCTORCH_STAGED"):  # first: a warm standby imports torch next
        from hpctorch.stage.hotrecord import install as record_hot_set

        record_hot_set()
    _apply_lists()
    warm = sys.argv[1:2] == ["--standby"]
    if warm:  # a warm standby (hpctorch.start.standby): imports ahead, then becomes a worker
        from hpctorch.start.standby import after_go, wait_for_go

        wait_for_go()
        _apply_lists()  # what it derives (HPCTORCH_CPUS...) into the worker's own environment
        after_go()
    argv = sys.argv[1:]
    if argv[:1] == ["--exec"]:
        os.execvp(argv[1], argv[1:])
    _register_stack_dump(warm)
    from hpctorch.start import storewait

    if storewait.needed(os.environ):  # first, so --timings sees the script's call before the wait
        storewait.install()
    if os.environ.get("HPCTORCH_TIMINGS"):  # hpctorch run --timings
        from hpctorch.timings_worker import install

        install()
    if os.environ.get("HPCTORCH_AGREED"):  # several nodes started by hpctorch (supervisor)
        from hpctorch.guard.agreement_worker import install as agree_first

        agree_first()
    if os.environ.get("HPCTORCH_STRAGGLERS_DIR"):  # the straggler watch (on unless --stragglers off)
        from hpctorch.guard.straggler_worker import install as time_collectives

        time_collectives()
    if os.environ.get("HPCTORCH_FILE_STORE"):  # --rdzv-backend file
        from hpctorch.start.filestore import env_by_file

        env_by_file(os.environ["HPCTORCH_FILE_STORE"])
    try:
        _run_python(argv)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as error:  # noqa: BLE001 - the script's own: shown as python would, recorded for the closing line
        from hpctorch.start.raised import report

        report(error)
        sys.exit(1)


if __name__ == "__main__":
    main()

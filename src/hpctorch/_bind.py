"""Per-node mode's worker wrapper: ``python _bind.py <worker argv>``.

torch's elastic agent starts every local worker with one command and one environment;
this gives worker LOCAL_RANK its own CPUs (sched_setaffinity, before torch starts any
thread), HPCTORCH_CPUS, HPCTORCH_DEVICES and OMP_NUM_THREADS from the plan's lists,
then execs the worker. Run as a file, it imports only ``hpctorch.cpulist``.
"""

import os
import sys

from hpctorch.cpulist import bind_to


def main() -> None:
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    cpu_sets = os.environ.get("HPCTORCH_CPU_SETS", "").split(";")
    device_sets = os.environ.get("HPCTORCH_DEVICE_SETS", "").split(";")
    threads = os.environ.get("HPCTORCH_THREAD_COUNTS", "").split(",")
    if rank < len(cpu_sets) and cpu_sets[rank]:
        bind_to(cpu_sets[rank])
        os.environ["HPCTORCH_CPUS"] = cpu_sets[rank]
    if rank < len(device_sets) and device_sets[rank]:
        os.environ["HPCTORCH_DEVICES"] = device_sets[rank]
    if rank < len(threads) and threads[rank]:
        os.environ["OMP_NUM_THREADS"] = threads[rank]
    os.execvp(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()

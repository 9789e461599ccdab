"""Benchmark 5: 32 single-node jobs started at once on one host: how many fail, with
torchrun's defaults (torch 2.13 binds a free port for a single node), torchrun with the
fixed --master-port job scripts copy, and hpctorch run."""

from __future__ import annotations

import argparse
import subprocess
import time
from collections.abc import Sequence

from .common import PYTHON, WORKER, clean_env, save, table


def burst(command: Sequence[str], jobs: int) -> tuple[int, float, str]:
    """(failures, wall seconds, one failure's last line)."""
    started = time.perf_counter()
    processes = [subprocess.Popen(list(command), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=clean_env()) for _ in range(jobs)]
    errors = [p.communicate(timeout=600)[1] for p in processes]
    wall = time.perf_counter() - started
    failed = [err for err, p in zip(errors, processes) if p.returncode != 0]
    example = next((line for line in reversed(failed[0].splitlines()) if line.strip()), "") if failed else ""
    return len(failed), wall, example[:160]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=32)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    jobs = 1 if args.smoke else args.jobs  # a smoke run shows each command runs and is timed, not how many collide
    cases = {
        "torchrun --nproc-per-node 1 (defaults)": [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "1", WORKER],
        # What job scripts copy: a fixed port, the same in every job.
        "torchrun --nproc-per-node 1 --master-port 29500": [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "1",
                                                            "--master-port", "29500", WORKER],
        "hpctorch run --nproc-per-node 1": [PYTHON, "-m", "hpctorch", "run", "--nproc-per-node", "1", WORKER],
    }
    data = {}
    for name, command in cases.items():
        failures, wall, example = burst(command, jobs)
        data[name] = {"jobs": jobs, "failures": failures, "wall_s": wall, "example": example}
    print(table(["command", "jobs", "failed", "wall s", "a failure's last line"],
                [[n, d["jobs"], d["failures"], f"{d['wall_s']:.1f}", f"`{d['example']}`" if d["example"] else ""] for n, d in data.items()]))
    if not args.smoke:
        save("port_collisions", data)


if __name__ == "__main__":
    main()

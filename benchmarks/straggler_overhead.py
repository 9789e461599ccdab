"""9. What the straggler watch costs a running job: the same DDP job through ``hpctorch run``
with ``--stragglers off`` and with the watch on (the default), interleaved; rank 0 times the
median step and a small all_reduce. gloo on the CPU here; ``--device cuda`` times NCCL (CUDA-event
timing and torch's completion hook) where there are GPUs. Results of each device are kept.

    python -m benchmarks.straggler_overhead [--device cpu|cuda] [--ranks N] [--repeats R] [--steps S] [--width W]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

from .common import HERE, PYTHON, RESULTS, interleaved, save, table, timed


def one_run(device: str, ranks: int, on: bool, shape: argparse.Namespace) -> dict[str, float]:
    env = {**os.environ, "BENCH_DEVICE": device, "PYTHONUNBUFFERED": "1", "BENCH_STEPS": str(shape.steps), "BENCH_WIDTH": str(shape.width),
           "BENCH_BUCKET_MB": f"{shape.bucket_mb:g}", "BENCH_BATCH": str(shape.batch)}
    argv = [PYTHON, "-m", "hpctorch", "run", "--quiet", "--no-prefix", "--nproc-per-node", str(ranks),
            "--stragglers", "warn" if on else "off", str(HERE / "straggler_step.py")]
    _wall, done = timed(argv, timeout=600, env=env)
    for line in done.stdout.splitlines():
        if line.startswith("BENCH "):
            return json.loads(line[6:])
    raise SystemExit(f"the job failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")


def wrapper_cost(calls: int = 200_000) -> dict[str, float]:
    """The host timing's own cost, in this process: the real wrapper around a collective that
    does nothing (a blocking call, and an asynchronous one whose future is already done), and
    the merge of a window's intervals."""
    import time

    import torch

    from hpctorch.guard import straggler_worker as worker

    tensor = torch.ones(1)
    done = torch.futures.Future()
    done.set_result(None)

    class Work:
        def get_future(self):  # type: ignore[no-untyped-def]
            return done

    costs = {}
    for name, collective in (("blocking", lambda *a, **k: None), ("asynchronous", lambda *a, **k: Work())):
        timed_one = worker._host_timed(collective)
        for fn, key in ((collective, "bare"), (timed_one, "timed")):
            started = time.perf_counter()
            for _ in range(calls):
                fn(tensor, async_op=True)
            costs[f"{name}_{key}_us"] = (time.perf_counter() - started) / calls * 1e6
        costs[f"{name}_us"] = costs[f"{name}_timed_us"] - costs[f"{name}_bare_us"]
    started = time.perf_counter()
    worker.METER.totals(time.monotonic())
    costs["merge_per_interval_us"] = (time.perf_counter() - started) / max(1, 2 * calls) * 1e6
    return {k: round(v, 3) for k, v in costs.items() if not k.endswith(("_bare_us", "_timed_us"))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300, help="timed steps per run (after 10 untimed)")
    parser.add_argument("--width", type=int, default=512, help="the 8 linear layers' width: 4 MB of parameters per layer at 1024")
    parser.add_argument("--bucket-mb", type=float, default=1.0, help="DDP's bucket size: a collective per bucket")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--smoke", action="store_true", help="one short run of each, results not saved")
    args = parser.parse_args()
    if args.smoke:
        args.repeats, args.steps = 1, 10
    runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    cases = {name: (lambda name=name: runs[name].append(one_run(args.device, args.ranks, name == "on", args)) or 0.0) for name in runs}
    interleaved(cases, args.repeats)
    row = {"device": args.device, "backend": "nccl" if args.device == "cuda" else "gloo", "ranks": args.ranks, "repeats": args.repeats,
           "steps": args.steps, "width": args.width, "bucket_mb": args.bucket_mb, "batch": args.batch}
    for name, values in runs.items():
        row[f"step_{name}_s"] = statistics.median(v["step_s"] for v in values)
        row[f"collective_{name}_us"] = statistics.median(v["collective_s"] for v in values) * 1e6
    row["step_overhead"] = row["step_on_s"] / row["step_off_s"] - 1
    row["collective_overhead_us"] = row["collective_on_us"] - row["collective_off_us"]
    row["wrapper"] = wrapper_cost()
    print(table(["backend", "step off (ms)", "step on (ms)", "wrapper per collective (us)"],
                [[row["backend"], f"{row['step_off_s'] * 1e3:.2f}", f"{row['step_on_s'] * 1e3:.2f}", f"{row['wrapper']['blocking_us']:.2f}"]]))
    if args.smoke:
        return
    path = RESULTS / "straggler_overhead.json"
    saved = json.loads(path.read_text()) if path.exists() else {}
    rows = saved.get("rows", [])
    shape = ("device", "width", "bucket_mb", "batch")
    rows = [r for r in rows if any(r.get(k) != row[k] for k in shape)] + [row]
    print(json.dumps(row, indent=2))
    kept = {k: v for k, v in saved.items() if k == "gpu_machine"}  # where the NCCL rows were measured, when they were
    print(save("straggler_overhead", {**kept, "rows": rows}))


if __name__ == "__main__":
    main()

"""13. What a hot set's pack carries (``--stage-env``, ``stage.hotset``), and the time to a staged
start at 16 -> 4,096 nodes by model.

A real staged run (``hpctorch run --stage-env``, one node: node 0's own copy, made whole) of the
toy DDP job from this test run's environment; its worker records what it reads. Then the pack a
later job's node 0 makes from that record (what the job read whole, the rest as links), and each
pack received as a node receives it (``unpack.receive``: extracted, checked, mended). Per-hop
throughput is the real tree's (benchmark 10's ``simulate``): one parent to 4 children over
loopback. The model: a pipelined tree delivers S bytes to every node in S / r plus one chunk per
hop (depth log_4 N), r the slower of a hop's rate and a node's extraction; node 0 packs once per
environment and hot set (kept).

    python -m benchmarks.stage_hot [--python PY] [--script FILE ARGS]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from .common import PYTHON, ROOT, clean_env, isolated, save, table

NODES = (16, 64, 256, 1024, 4096)
EZPZ = {1024: 255.0, 4096: 750.0}
"""ALCF ezpz's published figures for copying an environment to every node (``yeet``, Aurora)."""
HOP_MIB = 256


def staged_run(python: str, script: list[str], stage_dir: str) -> str:
    """One real staged run; the folder of node 0's copy."""
    env = {**clean_env(), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([python, "-m", "hpctorch", "run", "--quiet", "--stage-env", "--stage-dir", stage_dir, "--nproc-per-node", "1",
                           *script], capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"the staged run failed: {done.stderr[-2000:]}")
    copies = [os.path.join(root, name) for root, dirs, _ in os.walk(stage_dir) if root.endswith("/copies") for name in dirs
              if not name.startswith(".") and os.path.isfile(os.path.join(root, name, "staged.json"))]
    if len(copies) != 1:
        raise SystemExit(f"expected one copy in {stage_dir}, found {copies}")
    return copies[0]


def received(made, key: str, roots: list[str], where: str) -> float:  # type: ignore[no-untyped-def]
    """Seconds for a node to take ``made`` from its bytes: extract, check, mend."""
    from hpctorch.stage import unpack

    os.makedirs(where, mode=0o700)
    started = time.perf_counter()
    unpack.receive(made.chunks(), where, key, roots, made.size, made.digest)
    return time.perf_counter() - started


def held(copy: str) -> tuple[int, int]:
    """What a node holds in a copy: files on its own disk, and links (the environment's own, and
    a hot set's pack's to the shared path)."""
    whole = links = 0
    for folder, dirs, files in os.walk(copy):
        for name in files + dirs:
            path = os.path.join(folder, name)
            if os.path.islink(path):
                links += 1
            elif os.path.isfile(path):
                whole += 1
    return whole, links


def measure(python: str, script: list[str], hop_mib: float) -> dict:
    from hpctorch.stage import environment, hotset, pack

    from .stage_spread import simulate

    probe = subprocess.run([python, "-c", "import sys; print(sys.prefix); print(sys.base_prefix); print(sys.executable)"],
                           capture_output=True, text=True, check=True).stdout.split("\n")
    source = environment.source(prefix=probe[0], base_prefix=probe[1], executable=probe[2])
    with tempfile.TemporaryDirectory(prefix="hpctorch-bench-hot-") as scratch:
        os.mkdir(os.path.join(scratch, "stage"))
        copy = staged_run(python, script, os.path.join(scratch, "stage"))
        key = os.path.basename(copy)
        base = os.path.join(scratch, "node0")
        os.makedirs(base)
        started = time.perf_counter()
        full = pack.pack(source.roots, key, base, source.skip)
        full_pack_s = time.perf_counter() - started
        names = hotset.with_sources(hotset.recorded(copy))
        started = time.perf_counter()
        hot = pack.pack(source.roots, key, base, source.skip, names)
        hot_pack_s = time.perf_counter() - started
        walked = environment.key(source.roots, source.skip)
        full_take_s = received(full, key, list(source.roots), os.path.join(scratch, "full"))
        full_held = held(os.path.join(scratch, "full", key))
        shutil.rmtree(os.path.join(scratch, "full"))
        hot_take_s = received(hot, key, list(source.roots), os.path.join(scratch, "hot"))
        hot_held = held(os.path.join(scratch, "hot", key))
    one = simulate(2, hop_mib, 1)
    four = simulate(5, hop_mib, 4)
    return {"environment": list(source.roots), "script": script, "files": walked.files, "bytes": walked.size,
            "full": {"bytes": full.size, "pack_s": round(full_pack_s, 2), "take_s": round(full_take_s, 2), "files_whole": full_held[0],
                     "links": full_held[1]},
            "hot": {"bytes": hot.size, "pack_s": round(hot_pack_s, 2), "take_s": round(hot_take_s, 2), "recorded": len(names),
                    "files_whole": hot_held[0], "links": hot_held[1], "linked": hot.linked},
            "hop_mib": hop_mib, "one_child_s": one["seconds"], "four_children_s": four["seconds"]}


def model(row: dict, which: str, nodes: int) -> float:
    """Seconds from node 0's go to the last node's copy, the pack kept: S / r + depth x chunk / r."""
    from hpctorch.stage import spread

    size = row[which]["bytes"]
    per_child = row["hop_mib"] * 2**20 / row["four_children_s"]  # a parent's rate to each of its 4 children
    extract = size / row[which]["take_s"]
    rate = min(per_child, extract)
    return size / rate + spread.depth_of(nodes, 4) * spread.CHUNK / rate


HEADER = ["pack", "bytes per node", "files whole / links", "node 0 packs s (once)", "a node takes it s", "per-child MiB/s (k = 4)",
          *[f"{n:,} nodes s" for n in NODES]]


def cells(row: dict) -> list[list[object]]:
    per_child = row["hop_mib"] / row["four_children_s"]
    out = []
    for which, label in (("full", "the whole environment"), ("hot", "the hot set")):
        part = row[which]
        out.append([label, f"{part['bytes'] / 2**20:,.0f} MiB", f"{part['files_whole']:,} / {part.get('links', 0):,}", f"{part['pack_s']:.1f}",
                    f"{part['take_s']:.1f}", f"{per_child:.0f}", *[f"{model(row, which, n):.1f}" for n in NODES]])
    return out


BESIDE_HEADER = ["to every node", *[f"{n:,} nodes s" for n in EZPZ]]


def beside(row: dict) -> list[list[object]]:
    """The model's times beside ALCF ezpz's published ones (a real machine, the same sizes of job)."""
    return [["hpctorch, the whole environment (model, this machine's rates)", *[f"{model(row, 'full', n):.1f}" for n in EZPZ]],
            ["hpctorch, the hot set (model, this machine's rates)", *[f"{model(row, 'hot', n):.1f}" for n in EZPZ]],
            ["ALCF ezpz, `yeet` over rsync/ssh (Aurora, published)", *[f"{s:.0f}" for s in EZPZ.values()]]]


def main() -> None:
    status = isolated("benchmarks.stage_hot", sys.argv[1:])  # benchmark 10's tree: torch's store looks up every peer's name
    if status is not None:
        raise SystemExit(status)
    parser = argparse.ArgumentParser()
    parser.add_argument("--python", default=PYTHON, help="the interpreter whose environment is staged")
    parser.add_argument("--script", nargs=argparse.REMAINDER, default=[str(ROOT / "examples" / "toy_ddp.py"), "--steps", "3"])
    parser.add_argument("--smoke", action="store_true", help="a small venv made here, 1 MiB hops, results not saved")
    args = parser.parse_args()
    if args.smoke:
        with tempfile.TemporaryDirectory(prefix="hpctorch-bench-hot-env-") as folder:
            python, script = _small(folder)
            row = measure(python, script, 1.0)
    else:
        row = measure(args.python, args.script, HOP_MIB)
    print(table(HEADER, cells(row)))
    print()
    print(table(BESIDE_HEADER, beside(row)))
    if not args.smoke:
        print(f"saved {save('stage_hot', row)}")


def _small(folder: str) -> tuple[str, list[str]]:
    """The staging tests' small environment (tests/smallenv.py: a venv of the system's Python with a
    package a job reads and one it never imports), and a script that reads the first."""
    from pathlib import Path

    from tests import smallenv

    why = smallenv.missing()
    if why is not None:
        raise SystemExit(f"the smoke run's small environment needs {why}")
    python = smallenv.make(Path(folder) / "env")
    script = os.path.join(folder, "job.py")
    with open(script, "w", encoding="utf-8") as handle:
        handle.write(f"import os, {smallenv.PACKAGE} as p\nopen(os.path.join(os.path.dirname(p.__file__), 'data.bin'), 'rb').read()\n")
    return str(python), [script]


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()

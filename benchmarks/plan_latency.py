"""Benchmark 2: `hpctorch plan` against `python -c pass`, and what importing hpctorch
costs (python -X importtime): torch must never be imported."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from pathlib import Path

from .common import PYTHON, clean_env, interleaved, save, summary, table, timed


def _run(argv: list[str]) -> float:
    elapsed, done = timed(argv, env=clean_env())
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    return elapsed


def import_profile() -> tuple[float, list[tuple[str, float]], bool]:
    """Import time of what `hpctorch plan` loads (hpctorch.cli.main, ms), its five most expensive
    modules, and whether torch came in (``import hpctorch`` alone loads nothing: it is lazy)."""
    done = timed([PYTHON, "-X", "importtime", "-c", "import hpctorch.cli.main"], env=clean_env())[1]
    rows = []
    for line in done.stderr.splitlines():
        match = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if match:
            rows.append((match.group(4), int(match.group(2)) / 1e3, len(match.group(3))))
    total = next(ms for name, ms, depth in rows if name == "hpctorch.cli.main")
    top = sorted(((n, ms) for n, ms, d in rows if n != "hpctorch.cli.main"), key=lambda r: -r[1])[:5]
    return total, top, any(name == "torch" or name.startswith("torch.") for name, _, _ in rows)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    repeats = 2 if args.smoke else args.repeats
    # Compile first, as pip does on install (this workplace sets PYTHONDONTWRITEBYTECODE,
    # under which an editable install would pay for compiling every module on every run).
    import compileall

    import hpctorch

    compileall.compile_dir(Path(hpctorch.__file__).parent, quiet=1)
    times = interleaved({
        "python -c pass": lambda: _run([PYTHON, "-c", "pass"]),
        "hpctorch plan --nproc-per-node 2": lambda: _run([PYTHON, "-m", "hpctorch", "plan", "--nproc-per-node", "2"]),
        "hpctorch plan --json (2 nodes, hand-given)": lambda: _run([PYTHON, "-m", "hpctorch", "plan", "--json", "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port", "29400"]),
    }, repeats)
    ms = {name: [v * 1e3 for v in values] for name, values in times.items()}
    base = summary(ms["python -c pass"])["median"]
    print(table(["command", "median ms", "min / max ms", "minus python -c pass"],
                [[n, f"{summary(v)['median']:.1f}", f"{summary(v)['min']:.1f} / {summary(v)['max']:.1f}", f"{summary(v)['median'] - base:.1f}"] for n, v in ms.items()]))
    total, top, torch_imported = import_profile()
    print(f"\nimport hpctorch.cli.main: {total:.1f} ms cumulative; torch imported: {torch_imported}")
    print(table(["module", "cumulative ms"], [[n, f"{t:.1f}"] for n, t in top]))
    if torch_imported:
        raise SystemExit("torch was imported by `import hpctorch`")
    if not args.smoke:
        save("plan_latency", {"ms": ms, "import_ms": total, "import_top": top, "torch_imported": torch_imported})


if __name__ == "__main__":
    main()

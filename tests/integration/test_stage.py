"""--stage-env on one machine: simulated nodes run their workers from the copy (the test run's own
venv and base interpreter, packed and unpacked for real), a second run reuses it, and the copy's
interpreter is the whole worker's: sys.prefix, torch and the stdlib all come from it, under hpctorch's
starter and torch's agent alike."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from ..conftest import clean_env, hpctorch, unprefixed

WHERE = """
import os, sys, json, torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
print("where " + json.dumps({"rank": dist.get_rank(), "sum": total.item(), "prefix": sys.prefix, "base": sys.base_prefix,
                             "torch": torch.__file__, "json": json.__file__, "executable": sys.executable}), flush=True)
dist.destroy_process_group()
os._exit(0)
"""


def where(output: str) -> list[dict]:
    return [json.loads(line[len("where "):]) for line in unprefixed(output).splitlines() if line.startswith("where ")]


def test_simulated_nodes_run_from_the_copy_and_later_runs_reuse_it(tmp_path: Path) -> None:
    script = tmp_path / "where.py"
    script.write_text(WHERE)
    stage = tmp_path / "stage"
    stage.mkdir()
    args = ("run", "--simulate-nodes", "2", "--nproc-per-node", "1", "--stage-env", "--stage-dir", str(stage), str(script))
    done = hpctorch(*args, env=clean_env(), timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    copies = next((stage / f"hpctorch-stage-{os.getuid()}").glob("*/copies"))
    (copy,) = list(copies.iterdir())
    ranks = where(done.stdout + done.stderr)
    assert sorted(r["rank"] for r in ranks) == [0, 1] and {r["sum"] for r in ranks} == {2.0}
    for r in ranks:
        for field in ("prefix", "base", "torch", "json", "executable"):
            assert r[field].startswith(str(copy) + "/"), (field, r)
    assert {r["prefix"] for r in ranks} != {os.path.realpath(sys.prefix)}
    assert re.search(r"hpctorch: the workers run from a copy of .* on each node's own disk", done.stderr)
    made = json.loads((copy / "staged.json").read_text())["made"]
    again = hpctorch(*args, env=clean_env(), timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [p.name for p in copies.iterdir()] == [copy.name]
    assert json.loads((copy / "staged.json").read_text())["made"] == made  # reused, not made again
    assert {r["torch"] for r in where(again.stdout + again.stderr)} == {r["torch"] for r in ranks}
    # torch's elastic agent (--max-restarts) starts the workers from the same copy.
    agent = hpctorch("run", "--nproc-per-node", "2", "--max-restarts", "1", "--stage-env", "--stage-dir", str(stage), str(script),
                     env=clean_env(), timeout=300)
    assert agent.returncode == 0, agent.stderr[-3000:]
    assert {r["torch"] for r in where(agent.stdout + agent.stderr)} == {r["torch"] for r in ranks}

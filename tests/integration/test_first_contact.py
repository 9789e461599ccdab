"""What a new user meets first, run as they would: the real command line, its real output."""

from __future__ import annotations

import re

import pytest

import hpctorch as package

from ..conftest import clean_env, hpctorch


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_the_version_names_hpctorch_torch_and_python(flag: str) -> None:
    import torch

    done = hpctorch(flag, env=clean_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    line = done.stdout.strip()
    assert re.fullmatch(rf"hpctorch {re.escape(package.__version__)} \(\S+\), torch {re.escape(torch.__version__)}, Python \d+\.\d+\.\d+ \(\S+\)", line), line


def test_the_top_level_help_lists_the_version_flag() -> None:
    done = hpctorch("--help", env=clean_env(), timeout=60)
    assert done.returncode == 0 and "--version" in done.stdout


@pytest.mark.parametrize(("typed", "meant"), [("--nproc-per-nod", "--nproc-per-node"), ("--simulate-node=2", "--simulate-nodes=2")])
def test_a_mistyped_option_gets_the_nearest_spelling_and_the_subcommands_help(typed: str, meant: str) -> None:
    args = ("run", typed, "2", "train.py") if "=" not in typed else ("run", typed, "train.py")
    done = hpctorch(*args, env=clean_env(), timeout=60)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"hpctorch: error: run: unrecognized arguments: {typed}"), line
    assert f"did you mean {meant} for {typed}?" in line and line.endswith("fix: see 'hpctorch run --help'"), line


RAISES = """
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    row = {}["missing_column"]
dist.barrier()
"""


@pytest.mark.parametrize("starter", [(), ("--tee", "3")], ids=["hpctorch-starter", "torch-agent"])
def test_a_rank_that_raises_shows_the_users_frames_once_and_the_last_line_names_the_exception(tmp_path, starter) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "train.py"
    script.write_text(RAISES)
    done = hpctorch("run", "--nproc-per-node", "2", *starter, str(script), env=clean_env(), timeout=180, cwd=tmp_path)
    assert done.returncode == 1
    rank1 = [line.split(": ", 1)[1] for line in done.stdout.splitlines() + done.stderr.splitlines() if line.startswith("[rank 1]: ")]
    traceback_lines = rank1[rank1.index("Traceback (most recent call last):"):]
    assert traceback_lines[:3] == ["Traceback (most recent call last):", f'  File "{script}", line 6, in <module>',
                                   '    row = {}["missing_column"]'], rank1
    assert traceback_lines[-1] == "KeyError: 'missing_column'"
    text = done.stdout + done.stderr
    assert text.count("KeyError: 'missing_column'\n") == 1  # once, by the rank
    for ours in ("_worker.py", "runpy", "straggler_worker.py", "[rank1]:"):
        assert ours not in text, ours  # hpctorch's frames, runpy's, torch's second prefix
    last = done.stderr.strip().splitlines()[-1]
    assert re.match(r"hpctorch: rank 1 \(local rank 1\) raised KeyError: 'missing_column' at train\.py:6; details: \S+error\.json$", last), last
    assert done.stderr.count("raised KeyError") == 1  # the closing line, once


def test_on_several_nodes_the_last_line_names_the_rank_that_raised_not_the_peers_it_broke(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Rank 1 (node 1) raises; rank 0 (node 0), in a barrier with it, then fails too ("Connection
    closed by peer"). The job's last line names rank 1's exception, once, whichever node saw its
    failure first; torch's agent's own lines about its workers (``E... failed (exitcode: 1)``) are
    not shown unless --verbose."""
    script = tmp_path / "train.py"
    script.write_text(RAISES)
    done = hpctorch("run", "--simulate-nodes", "2", "--nproc-per-node", "1", str(script), env=clean_env(), timeout=180, cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert re.match(r"hpctorch: (stopped: )?rank 1 on node 1 \(local rank 0\) raised KeyError: 'missing_column' at train\.py:6; "
                    r"details: \S+error\.json; the other nodes were stopped$", last), done.stderr[-3000:]
    assert done.stderr.count("raised KeyError") == 1, done.stderr[-3000:]
    assert not re.search(r"^[WE]\d{4} ", done.stderr, re.M), done.stderr[-3000:]
    verbose = hpctorch("run", "--verbose", "--simulate-nodes", "2", "--nproc-per-node", "1", str(script), env=clean_env(), timeout=180,
                       cwd=tmp_path)
    assert re.search(r"^E\d{4} .*failed \(exitcode: 1\)", verbose.stderr, re.M), verbose.stderr[-3000:]


def test_hostlist_compress_reads_names_from_stdin() -> None:
    import subprocess
    import sys

    from ..conftest import ROOT

    done = subprocess.run([sys.executable, "-m", "hpctorch", "hostlist", "compress"], input="n1\nn2 n3\nn7\n", capture_output=True,
                          text=True, env=clean_env(), timeout=60, cwd=ROOT)
    assert (done.returncode, done.stdout.strip()) == (0, "n[1-3,7]"), done.stderr


def _options_of(command: str) -> set[str]:
    from hpctorch.cli.parser import parser

    top = parser(command)
    sub = next(a for a in top._actions if a.__class__.__name__ == "_SubParsersAction").choices[command]
    return {o for action in sub._actions for o in action.option_strings if action.help != "==SUPPRESS=="} - {"-h", "--help"}


def test_plan_takes_every_option_of_run() -> None:
    assert _options_of("run") - _options_of("plan") == set()


GUARDED = ("--max-restarts", "2", "--stall-timeout", "600", "--stall-action", "kill", "--screen=fail", "--spare-nodes", "1",
           "--stragglers", "off", "--timings")


def test_plan_says_what_runs_guards_would_do(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    script = tmp_path / "train.py"
    script.write_text("pass\n")
    done = hpctorch("plan", "--nproc-per-node", "2", *GUARDED, str(script), env=clean_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    guards = done.stdout.split("  guards:\n", 1)[1]
    assert "no output from any rank for 600 s" in guards and "the job ends (exit 1)" in guards
    assert "a named node stops the job (exit 3); the 1 worst node(s) sit out as spares" in guards
    assert "stragglers off" in " ".join(guards.split()) and "timings" in guards
    shown = json.loads(hpctorch("plan", "--json", *GUARDED, str(script), env=clean_env(), timeout=60).stdout)
    assert shown["max_restarts"] == 2 and set(shown["guards"]) == {"stall", "screen", "stragglers", "timings"}
    staged = hpctorch("plan", f"--stage-env={tmp_path}", "--stage-env=try", str(script), env=clean_env(), timeout=60)
    assert staged.returncode == 0 and "a node that cannot stage runs from the shared path" in staged.stdout, staged.stderr
    bad = hpctorch("plan", "--stall-timeout", "0", str(script), env=clean_env(), timeout=60)  # checked as run checks it
    assert bad.returncode == 2 and "--stall-timeout 0" in bad.stderr


def test_submit_writes_runs_guards_on_its_run_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    done = hpctorch("submit", "--nodes", "2", "--time", "1:00", "--scheduler", "slurm", "--dry-run", *GUARDED, str(script),
                    env=clean_env(), timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if " -m hpctorch run " in line]
    assert line.split(" -m hpctorch run ", 1)[1] == ("--max-restarts 2 --stall-timeout 600 --stall-action kill --screen=fail --spare-nodes 1 "
                                                     f"--stragglers off --timings {script}")


def test_every_option_of_every_subcommand_has_help_and_run_help_is_grouped_with_examples() -> None:
    import argparse

    from hpctorch.cli.parser import parser

    top = parser()
    subs = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices
    bare = [f"{name} {a.option_strings[0]}" for name, sub in subs.items() for a in sub._actions if a.option_strings and not a.help]
    assert bare == []
    shown = hpctorch("run", "--help", env=clean_env(), timeout=60).stdout
    titles = [line for line in shown.splitlines() if line and not line[0].isspace() and line.endswith(":")]
    assert [t.split(":")[0] for t in titles] == ["positional arguments", "options", "launch", "output", "torchrun's options (torch's agent and rendezvous; same names and meaning)",
                                                 "guards", "staging", "examples"], titles
    doctor = hpctorch("doctor", "--help", env=clean_env(), timeout=60).stdout
    assert doctor.index("--timeout S") < doctor.index("--nproc-per-node")  # its own options first

"""A real Grid Engine cell (Debian's gridengine 8.1.9) on node1 of the test cluster.

sge_qmaster and sge_execd run in node1's network and host-name namespaces, where the
name node1 and its address agree both ways (/etc/hosts): Grid Engine refuses hosts whose
name and address disagree, which is why the cell is not built on the machine itself
(its name resolves to 127.0.0.1, which resolves back to localhost). One host only:
node2's daemons would reach node1 through the name's management address, which by the
harness's design reaches nothing.

The cell is configured through ``qconf`` as an administrator would: exec and submit host,
a parallel environment ``hpct`` ($fill_up, control_slaves), a queue ``all.q`` offering it,
a one-second scheduler interval and root allowed to run jobs. ``qconf``'s interactive
commands open $EDITOR on a template; the editor here is ``sed`` applied to that template.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from .harness import Cluster, _kill_by_pidfile

SGE_ROOT = Path("/var/lib/gridengine")
CELL = "default"
SPOOL = Path("/var/spool/gridengine")
HOST = "node1"
PE = "hpct"
SLOTS = 4


def missing() -> list[str]:
    """What this machine lacks for the cell (empty when it can build it)."""
    lacking = [tool for tool in ("sge_qmaster", "sge_execd", "qconf", "qsub") if not (shutil.which(tool) or Path("/usr/sbin", tool).exists())]
    if not (SGE_ROOT / CELL / "common" / "bootstrap").exists():
        lacking.append(f"a configured cell ({SGE_ROOT / CELL}; Debian's gridengine-master sets it up)")
    return lacking


def stop_daemons() -> None:
    """Stop the cell's daemons, if running (also from the cluster's own teardown)."""
    for pidfile in (SPOOL / "execd" / HOST / "execd.pid", SPOOL / "qmaster" / "qmaster.pid"):
        _kill_by_pidfile(pidfile)


class GridEngine:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.dir = cluster.dir / "gridengine"
        self.act_qmaster = SGE_ROOT / CELL / "common" / "act_qmaster"

    def env(self, **extra: str) -> dict[str, str]:
        return self.cluster.env(SGE_ROOT=str(SGE_ROOT), SGE_CELL=CELL, **extra)

    def run(self, argv: list[str], timeout: float = 60, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(self.cluster.on(HOST, argv), capture_output=True, text=True, timeout=timeout, env=self.env(**extra))

    def up(self) -> "GridEngine":
        self.dir.mkdir(parents=True, exist_ok=True)
        original = self.dir / "act_qmaster.original"
        if not original.exists():
            shutil.copy(self.act_qmaster, original)
        self.act_qmaster.write_text(HOST + "\n")
        self._daemon("/usr/sbin/sge_qmaster")
        self._until(lambda: self.run(["qconf", "-sh"]).returncode == 0, "sge_qmaster answering qconf")
        self._qconf_edit("-mconf", "global", ["s/^min_uid .*/min_uid 0/", "s/^min_gid .*/min_gid 0/"])
        self.run(["qconf", "-as", HOST])
        if HOST not in self.run(["qconf", "-sel"]).stdout.split():
            self._qconf_edit("-ae", None, [f"s/^hostname .*/hostname {HOST}/"])
        self._daemon("/usr/sbin/sge_execd")
        pe = ["s/^slots .*/slots 999/", "s/^allocation_rule .*/allocation_rule $fill_up/",
              "s/^control_slaves .*/control_slaves TRUE/", "s/^job_is_first_task .*/job_is_first_task FALSE/"]
        self._add_or_modify("-ap", "-mp", PE, [f"s/^pe_name .*/pe_name {PE}/", *pe], "-spl")
        queue = [f"s/^hostlist .*/hostlist {HOST}/", f"s/^slots .*/slots {SLOTS}/", f"s/^pe_list .*/pe_list {PE}/",
                 "s/^load_thresholds .*/load_thresholds NONE/", r"s/^shell .*/shell \/bin\/sh/"]
        self._add_or_modify("-aq", "-mq", "all.q", queue, "-sql")
        self._qconf_edit("-msconf", None, ["s/^schedule_interval .*/schedule_interval 0:0:1/", "s/^flush_submit_sec .*/flush_submit_sec 1/",
                                           "s/^flush_finish_sec .*/flush_finish_sec 1/"])
        self.run(["qmod", "-c", f"all.q@{HOST}"])  # a failed job of an earlier run may have left it in error
        self._until(lambda: f"all.q@{HOST}" in self.run(["qstat", "-f"]).stdout
                    and not self._queue_states(), "the queue all.q on node1 ready")
        return self

    def down(self) -> None:
        stop_daemons()
        original = self.dir / "act_qmaster.original"
        if original.exists():
            shutil.copy(original, self.act_qmaster)

    def qsub(self, job_dir: Path, script: Path, *options: str, timeout: float = 240) -> tuple[int, str]:
        """Submit from node1 and wait for the end (-sync y): (qsub's exit status, the job's output)."""
        out = job_dir / "out.txt"
        done = self.run(["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), "qsub", "-sync", "y", "-cwd", "-j", "y",
                         "-o", str(out), *options, str(script)], timeout=timeout)
        return done.returncode, (out.read_text() if out.exists() else "") + done.stdout + done.stderr

    def _queue_states(self) -> str:
        """The queue instance's state letters (empty when it takes jobs)."""
        for line in self.run(["qstat", "-f"]).stdout.splitlines():
            fields = line.split()
            if fields and fields[0] == f"all.q@{HOST}":
                return fields[5] if len(fields) > 5 else ""
        return "?"

    def _daemon(self, path: str) -> None:
        done = self.run([path])
        if done.returncode != 0:
            raise RuntimeError(f"{path} did not start: {done.stderr.strip()}")

    def _qconf_edit(self, action: str, name: str | None, edits: list[str]) -> None:
        script = self.dir / "edits.sed"
        script.write_text("\n".join(edits) + "\n")
        editor = self.dir / "editor"
        editor.write_text('#!/bin/sh\nexec sed -i -f "$SGE_EDITS" "$1"\n')
        editor.chmod(0o755)
        done = self.run(["qconf", action, *([name] if name else [])], EDITOR=str(editor), SGE_EDITS=str(script))
        if done.returncode != 0:
            raise RuntimeError(f"qconf {action} {name or ''} failed: {(done.stderr or done.stdout).strip()}")

    def _add_or_modify(self, add: str, modify: str, name: str, edits: list[str], listing: str) -> None:
        exists = name in self.run(["qconf", listing]).stdout.split()
        self._qconf_edit(modify if exists else add, name, edits)

    def _until(self, ready, what: str, timeout: float = 60) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(0.5)
        raise RuntimeError(f"Grid Engine: no {what} after {timeout:.0f} s; see {SPOOL}/qmaster/messages")


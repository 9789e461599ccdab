"""One process per node that started Python and imported torch once, and forks each warm standby
(``start.standby``) from itself: a standby then costs a fork, not an interpreter and torch's
import (2-3 CPU-seconds each, per local rank, per restart), and shares those pages with its
siblings until it writes them.

- The zygote is started as a standby is (the worker entry, ``--standby``, that local rank's
  environment) with ``HPCTORCH_STANDBY_ZYGOTE`` naming its end of a Unix socket pair; it imports
  ahead as a standby does, then serves. Its name (``/proc/PID/comm``) is ``hpctorch-zygote``.
- A fork: the agent sends the standby's environment and the read end of the standby's stdin pipe
  (SCM_RIGHTS), and for a worker forked at once (``standby.Standbys.start_now``) the stdin, stdout and stderr
  it is to have after the go; the zygote forks; the child starts its own session, takes that pipe
  as stdin and that environment, and goes on as a standby; the zygote answers with the child's pid.
- Preemption notices (SIGUSR1, SIGUSR2) are ignored by the zygote, whose children are workers: a
  notice meant for them must not end it; each child has them as a fresh interpreter does.
- Exits: the standby is the zygote's child, so the zygote reaps it (SIGCHLD wakes it) and sends
  its exit code; the agent's ``Forked`` holds it for torch's agent, which sees a ``Popen``: pid,
  ``poll``, ``wait``, signals to the pid and its process group.
- The agent gone (end-of-file): the zygote exits. The zygote gone: each ``Forked`` still running
  is watched by its pid (reaped by init then, its exit code unknown: -9).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence

ENV = "HPCTORCH_STANDBY_ZYGOTE"
NAME = "hpctorch-zygote"
MESSAGE_BYTES = 200_000
"""The largest request (a standby's environment): within a Unix socket's default send buffer."""
READY_S = 300.0
"""How long the agent waits for the zygote to import ahead and fork: torch from a busy shared
file system can take minutes; past it, standbys are started as their own processes."""
GONE_EXIT = -signal.SIGKILL
"""A standby's exit code when its zygote died before it: init reaped it, and nobody kept the code."""


class Forked:
    """A standby forked by the zygote, as torch's agent uses a ``subprocess.Popen``."""

    def __init__(self, pid: int, stdin, args: Sequence[str], zygote: Zygote) -> None:  # type: ignore[no-untyped-def]
        self.pid, self.stdin, self.args, self._zygote = pid, stdin, list(args), zygote
        self.stdout = self.stderr = None
        self.returncode: int | None = None
        try:  # once the zygote is gone, the pid alone could name another process
            self._pidfd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self._pidfd = None

    def poll(self) -> int | None:
        if self.returncode is None and self._zygote.gone and not self._alive():
            self._zygote.ended(self.pid, GONE_EXIT)
        return self.returncode

    def _alive(self) -> bool:
        if self._pidfd is None:
            return running(self.pid)
        return not select.select([self._pidfd], [], [], 0)[0]  # readable once the process ended

    def settled(self, code: int) -> None:
        self.returncode = code
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._zygote.changed:
            while self.poll() is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout)  # type: ignore[arg-type]
                # Bounded: after the zygote's end nobody notifies, and poll() looks at the pid itself.
                self._zygote.changed.wait(0.5 if left is None else min(left, 0.5))
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                if self._pidfd is not None:
                    signal.pidfd_send_signal(self._pidfd, sig)
                else:
                    os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def running(pid: int) -> bool:
    """Running: a zombie is not (whoever it was reparented to may never reap it: a container's init)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


class Zygote:
    """The agent's side: the zygote process, its socket, and the standbys it forked."""

    def __init__(self, command: Sequence[str], env: Mapping[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = subprocess.Popen(list(command), env={**env, ENV: str(theirs.fileno())}, pass_fds=(theirs.fileno(),),
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        self.command = tuple(command)
        self._socket = ours
        self._asking = threading.Lock()  # one request at a time: the next pid the zygote sends answers it
        self._answers: list[int] = []
        self.changed = threading.Condition()
        self._forked: dict[int, Forked] = {}
        self._early: dict[int, int] = {}  # an exit read before its pid's answer was taken
        self.gone = False
        threading.Thread(target=self._listen, name="hpctorch-zygote", daemon=True).start()

    def fork(self, env: Mapping[str, str], given: Sequence[int] = (), give_up: Callable[[], bool] = lambda: False) -> Forked | None:
        """A standby with ``env``, forked; None where the zygote cannot (gone, not ready in time, or
        ``give_up()`` while it waits: a stop asked for while torch imports from a slow file system).
        ``given``: the stdin, stdout and stderr it takes after its go (``wait_for_go``)."""
        message = json.dumps({"env": dict(env)}).encode()
        if self.gone or len(message) > MESSAGE_BYTES:
            return None
        read, write = os.pipe()
        try:
            with self._asking:
                try:
                    socket.send_fds(self._socket, [message], [read, *given])
                except OSError:
                    return None
                finally:
                    os.close(read)
                pid = self._answer(give_up)
            if pid is None:
                return None
            forked = Forked(pid, os.fdopen(write, "wb"), self.command, self)
            write = -1
            with self.changed:
                self._forked[pid] = forked
                if pid in self._early:
                    forked.settled(self._early.pop(pid))
            return forked
        finally:
            if write >= 0:
                os.close(write)

    def _answer(self, give_up: Callable[[], bool]) -> int | None:
        deadline = time.monotonic() + READY_S
        with self.changed:
            while not self._answers and not self.gone and not give_up():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.changed.wait(min(left, 0.5))
            if self._answers:
                return self._answers.pop(0)
        self.close()  # never ready (or given up: an answer that came later would answer the next request)
        return None

    def _listen(self) -> None:
        while True:
            try:
                message = self._socket.recv(256)
            except OSError:
                message = b""
            if not message:
                with self.changed:
                    self.gone = True
                    self.changed.notify_all()
                try:  # a zygote that ended by itself is reaped, not left a zombie
                    self.process.wait(5)
                except subprocess.TimeoutExpired:
                    pass
                return
            kind, pid, *code = message.decode().split()
            with self.changed:
                if kind == "pid":
                    self._answers.append(int(pid))
                elif kind == "exit":
                    self.ended(int(pid), int(code[0]))
                self.changed.notify_all()

    def ended(self, pid: int, code: int) -> None:
        with self.changed:
            forked = self._forked.pop(pid, None)
            if forked is None:
                self._early[pid] = code
            elif forked.returncode is None:
                forked.settled(code)
            self.changed.notify_all()

    def close(self) -> None:
        """The zygote goes (its standbys, workers or not, go their own way)."""
        with self.changed:
            self.gone = True
            self.changed.notify_all()
        try:
            self._socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            pass


def serve() -> tuple[int, ...]:
    """In the zygote, once it imported ahead: fork a standby per request. Returns only in a
    child, which is then a standby with the environment it was sent, with the descriptors it was
    given for after its go; the zygote itself exits when the agent goes."""
    channel = socket.socket(fileno=int(os.environ.pop(ENV)))
    comm = rename(NAME)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wakeup fd is written
    signal.set_wakeup_fd(wake_write)
    notices = [sig for sig in (getattr(signal, "SIGUSR1", None), getattr(signal, "SIGUSR2", None)) if sig is not None]
    for sig in notices:
        signal.signal(sig, signal.SIG_IGN)
    while True:
        ready, _, _ = select.select([channel, wake_read], [], [])
        if wake_read in ready:
            while True:
                try:
                    if not os.read(wake_read, 512):
                        break
                except BlockingIOError:
                    break
            _reap(channel)
        if channel not in ready:
            continue
        try:
            message, fds, _flags, _address = socket.recv_fds(channel, MESSAGE_BYTES, 4)
        except OSError:
            message, fds = b"", []
        if not message or not fds:
            os._exit(0)  # the agent is gone: so are the standbys' stdin, and they end themselves
        request = json.loads(message)
        settled_read, settled_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, *notices):
                signal.signal(sig, signal.SIG_DFL)
            for fd in (wake_read, wake_write, settled_read):
                os.close(fd)
            channel.close()
            os.setsid()  # torch's agent signals the worker's process group
            os.close(settled_write)  # the pid is answered once its group exists
            os.dup2(fds[0], 0)
            os.close(fds[0])
            os.environ.clear()
            os.environ.update(request["env"])
            rename(comm)
            return tuple(fds[1:])
        for fd in (*fds, settled_write):
            os.close(fd)
        os.read(settled_read, 1)  # end-of-file: the child is in its own session (or gone)
        os.close(settled_read)
        try:
            channel.send(f"pid {pid}".encode())
        except OSError:
            os._exit(0)


def _reap(channel: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        try:
            channel.send(f"exit {pid} {os.waitstatus_to_exitcode(status)}".encode())
        except OSError:
            os._exit(0)


def rename(name: str) -> str:
    """This process's name as ``ps`` and ``top`` show it; the one it had."""
    try:
        with open("/proc/self/comm", "r+", encoding="utf-8") as comm:
            before = comm.read().strip()
            comm.seek(0)
            comm.write(name[:15])
        return before
    except OSError:
        return name

"""The signals hpctorch gives a meaning to on this operating system."""

from __future__ import annotations

import signal

PREEMPT_SIGNALS: tuple[int, ...] = tuple(getattr(signal, name) for name in ("SIGUSR1", "SIGUSR2") if hasattr(signal, name))
"""What schedulers send before they preempt or end a job (Slurm's --signal, LSF's -wa);
Windows has neither."""

STOP_SIGNALS: tuple[int, ...] = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
                                      if hasattr(signal, name))
"""What ends a job's workers, as torch's agent takes them (TORCHELASTIC_SIGNALS_TO_HANDLE's
default): a dropped ssh or pdsh session sends SIGHUP, a terminal's Ctrl-\\ SIGQUIT."""

STACK_SIGNAL: int | None = (signal.SIGRTMIN + 7) if hasattr(signal, "SIGRTMIN") else getattr(signal, "SIGINFO", None)
"""A signal nothing else in a training job uses: real-time on Linux, SIGINFO on macOS
(SIGUSR1/2 belong to the job: Slurm's --signal and LSF's -wa send them to checkpoint).
A worker's faulthandler writes every thread's stack when it gets it."""

"""torchrun's command line (and torch.distributed.launch's), option by option, with
torchrun's meaning: `hpctorch run` takes any torchrun line with the command name swapped.

Options that state what hpctorch would otherwise work out (nodes, node rank, master,
port, rendezvous) win, as with torchrun; options that configure torch's elastic agent
are handed to its ``LaunchConfig`` unchanged (``AGENT``). Importing this module imports
no torch: ``hpctorch plan`` must stay fast.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from ..errors import HpctorchError

START_METHODS = ("spawn", "fork", "forkserver")
NUMA_MODES = ("node", "socket", "exclusive", "core-complex")  # torch's _AffinityMode values
RDZV_BACKENDS = ("static", "c10d", "etcd", "etcd-v2", "file")
DEFAULT_C10D_PORT = 29400  # torchrun's port for an endpoint given without one

# dest -> LaunchConfig field, for the options that only configure torch's agent.
AGENT = {
    "monitor_interval": "monitor_interval",
    "start_method": "start_method",
    "event_log_handler": "event_log_handler",
    "role": "role",
    "local_addr": "local_addr",
    "logs_specs": "logs_specs",
    "numa_binding": "numa_options",
    "signals_to_handle": "signals_to_handle",
    "shutdown_timeout": "shutdown_timeout",
    "virtual_local_rank": "virtual_local_rank",
    "duplicate_stdout_filters": "duplicate_stdout_filters",
    "duplicate_stderr_filters": "duplicate_stderr_filters",
}


def _comma_list(value: str) -> list[str]:
    return [item for item in value.split(",") if item]


def nnodes_range(value: str) -> tuple[int, int]:
    """torchrun's ``--nnodes N`` or ``MIN:MAX``."""
    parts = value.split(":")
    try:
        low, high = (int(parts[0]), int(parts[0])) if len(parts) == 1 else (int(parts[0]), int(parts[1]))
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"{value!r} is not a node count N or a range MIN:MAX") from None
    if len(parts) > 2 or not 0 < low <= high:
        raise argparse.ArgumentTypeError(f"{value!r}: give 0 < MIN <= MAX")
    return low, high


def add_options(parser: argparse.ArgumentParser) -> None:
    """torchrun's options hpctorch's own launch options do not already define."""
    add = parser.add_argument
    add("--rdzv-backend", "--rdzv_backend", choices=RDZV_BACKENDS, default=None,
        help="torch's rendezvous: static (hpctorch's default: every node knows the master), or c10d (torch's dynamic "
             "rendezvous: elastic node counts, restarts across nodes), or file (torch's FileStore in a directory, "
             "--rdzv-endpoint DIR: no TCP store)")
    add("--rdzv-endpoint", "--rdzv_endpoint", default=None, metavar="HOST[:PORT]", help="the rendezvous' host and port (c10d)")
    add("--rdzv-conf", "--rdzv_conf", default=None, metavar="K=V,...", help="rendezvous settings, as torchrun (join_timeout, ...)")
    add("--monitor-interval", "--monitor_interval", type=float, default=None, metavar="S", help="torch agent: seconds between worker checks")
    add("--start-method", "--start_method", choices=START_METHODS, default=None, help="torch agent: how workers start")
    add("--event-log-handler", "--event_log_handler", default=None, help="torch agent: event log handler")
    add("--role", default=None, help="torch agent: the workers' role name")
    add("--local-addr", "--local_addr", default=None, help="torch agent: this node's address for the rendezvous (default: hpctorch's)")
    add("--logs-specs", "--logs_specs", default=None, help="torch agent: a LogsSpecs entry point name")
    add("--numa-binding", "--numa_binding", choices=NUMA_MODES, default=None,
        help="torch's own NUMA binding of workers (then hpctorch binds no CPUs itself)")
    add("--signals-to-handle", "--signals_to_handle", default=None, help="torch agent: signals it forwards to workers")
    add("--shutdown-timeout", "--shutdown_timeout", type=int, default=None, metavar="S", help="torch agent: SIGTERM to SIGKILL")
    add("--virtual-local-rank", "--virtual_local_rank", action="store_true", default=None, help="torch agent: LOCAL_RANK 0 in every worker")
    add("--duplicate-stdout-filters", "--duplicate_stdout_filters", type=_comma_list, default=None, metavar="S,...",
        help="torch agent: stdout lines with these strings also go to a file of their own")
    add("--duplicate-stderr-filters", "--duplicate_stderr_filters", type=_comma_list, default=None, metavar="S,...",
        help="torch agent: stderr lines with these strings also go to a file of their own")
    add("--local-ranks-filter", "--local_ranks_filter", default=None, metavar="R,...", help="local ranks whose output reaches the console")
    add("--run-path", "--run_path", action="store_true", help="as torchrun: run the script by path (hpctorch always does)")
    # torch.distributed.launch: scripts that read their local rank from an argument.
    add("--use-env", "--use_env", action="store_true", help="torch.distributed.launch's flag: the environment carries LOCAL_RANK (always so)")
    add("--local-rank-arg", nargs="?", const="--local-rank", default=None, metavar="SPELLING",
        help="also pass the local rank as an argument, as torch.distributed.launch did: --local-rank=N "
             "(or the spelling given, e.g. --local-rank-arg=--local_rank)")


def agent_settings(args: argparse.Namespace) -> Mapping[str, object]:
    """The LaunchConfig fields the user set, by LaunchConfig's names."""
    return {field: getattr(args, dest) for dest, field in AGENT.items() if getattr(args, dest, None) is not None}


def rdzv_conf(value: str | None) -> dict[str, str]:
    """``k=v,k=v`` as torchrun reads ``--rdzv-conf``."""
    conf: dict[str, str] = {}
    for item in (value or "").split(","):
        if not item.strip():
            continue
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise HpctorchError(f"--rdzv-conf item {item!r} is not key=value", "write --rdzv-conf join_timeout=600,read_timeout=60")
        conf[key.strip()] = val.strip()
    return conf


def endpoint(value: str) -> tuple[str, int]:
    """``host``, ``host:port`` or ``[v6]:port`` -> (host, port)."""
    text = value.strip()
    host, port = text, str(DEFAULT_C10D_PORT)
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else port
    elif text.count(":") == 1:
        host, port = text.split(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise HpctorchError(f"--rdzv-endpoint {value!r} is not HOST[:PORT]", "write e.g. --rdzv-endpoint node001:29400")
    return host, int(port)


PROGRAM_MAGIC = (b"\x7fELF", b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe", b"\xca\xfe\xba\xbe")  # ELF, Mach-O, fat Mach-O


def not_python(path: str) -> str | None:
    """What a script given without --no-python is when Python would fail on it at once: a
    program, or another language's script (every worker would die of a SyntaxError).
    (Python also runs .pyc files and zip apps, which hold NUL bytes too: those pass.)"""
    try:
        with open(path, "rb") as source:
            head = source.read(512)
    except OSError:
        return None  # Python will say why
    if head.startswith(PROGRAM_MAGIC) or (head.startswith(b"MZ") and b"\0" in head):
        return "a program"
    first = head.split(b"\n", 1)[0]
    if first.startswith(b"#!") and b"python" not in first:
        return f"a script for {first[2:].decode(errors='replace').strip()}"
    return None

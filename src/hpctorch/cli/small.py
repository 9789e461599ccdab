"""The small commands: ``badnodes``, ``hostlist``, ``--version``."""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import HpctorchError
from ..schedulers import hostlist


def badnodes(args: argparse.Namespace) -> int:
    import time

    from ..host import badnodes

    names = [n for arg in getattr(args, "names", []) for part in arg.replace(",", " ").split() for n in hostlist.expand(part)]
    if args.action == "add":
        badnodes.add(os.environ, names, args.reason)
    elif args.action == "remove":
        badnodes.remove(os.environ, names)
    elif args.action == "clear":
        badnodes.clear(os.environ)
    else:
        entries = badnodes.current(os.environ)
        lasts = badnodes.days(os.environ) * 86400

        def shown(seconds: float) -> str:
            return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))

        if entries:
            print("node\tadded\tuntil\tjob\treason")
        for entry in entries:
            print(f"{entry.node}\t{shown(entry.time)}\t{shown(entry.time + lasts)}\t{entry.job or '-'}\t{entry.reason}")
        sys.stdout.flush()  # the table, then the count: never on one line of a terminal
        print(f"{len(entries)} bad node(s) in {badnodes.path(os.environ)} (each left out of your jobs for "
              f"{lasts / 86400:g} days, {badnodes.DAYS_ENV})", file=sys.stderr)
    return 0


def hostlist_command(args: argparse.Namespace) -> int:
    if args.action == "expand":
        print("\n".join(hostlist.expand(args.expr)))
    else:
        if not args.names and sys.stdin.isatty():
            raise HpctorchError("hostlist compress: no names given", "give the names (hpctorch hostlist compress n1 n2) or pipe them in")
        given = args.names if args.names and args.names != ["-"] else [sys.stdin.read()]  # none or "-": names on stdin
        names = [n for arg in given for n in arg.replace(",", " ").split()]
        print(hostlist.compress(names))
    return 0


def version_line() -> str:
    """hpctorch's version, the torch it would run (read without importing it) and the Python."""
    from .. import __file__ as package, __version__
    from ..storeclient import installed_torch

    torch = installed_torch()
    return (f"hpctorch {__version__} ({os.path.dirname(package)}), torch {torch or 'not installed'}, "
            f"Python {sys.version.split()[0]} ({sys.executable})")

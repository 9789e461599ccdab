"""The small commands: ``badnodes``, ``hostlist``, ``stage``, ``timeline``, ``--version``."""

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


def stage_command(args: argparse.Namespace) -> int:
    """``stage list``: this user's environment copies on this node; ``stage clean``: those no process runs from, removed."""
    import time

    from ..host import folders
    from ..stage import inventory
    from ..stage.pack import amount

    root = args.stage_dir or folders.local_scratch()
    if not os.path.isdir(root):
        raise HpctorchError(f"--stage-dir {root}: no such folder", "give the folder your jobs were given with run --stage-dir")
    where = folders.private_dir(os.path.join(folders.stage_dir(root), "copies"))
    memory = " (in memory: a tmpfs, counted against this node's RAM)" if inventory.in_memory(where) else ""
    if args.action == "clean":
        gone, freed, kept = inventory.clean(where)
        print(f"removed {len(gone)} cop{'y' if len(gone) == 1 else 'ies'} ({amount(freed)}) from {where}{memory}; "
              f"kept {len(kept)} a running process uses", file=sys.stderr)
        return 0
    found = inventory.copies(where)
    sizes = [copy.size() for copy in found]
    if found:
        print("key	size	last used	in use by	copies of")
    for copy, size in zip(found, sizes):
        users = ", ".join(f"pid {pid}" for pid in copy.users) or "-"
        what = "(being made)" if copy.partial and copy.users else "(half made, its job gone)" if copy.partial else ", ".join(copy.roots) or "-"
        print(f"{copy.key[:16]}\t{amount(size)}\t{time.strftime('%Y-%m-%d %H:%M', time.localtime(copy.used))}\t{users}\t{what}")
    sys.stdout.flush()  # the table, then the count: never on one line of a terminal
    idle = [c for c in found if not c.users]
    print(f"{len(found)} cop{'y' if len(found) == 1 else 'ies'}, {amount(sum(sizes))}, in {where}{memory}; "
          f"{len(found) - len(idle)} in use; hpctorch stage clean removes the {len(idle)} no process runs from", file=sys.stderr)
    return 0


def timeline(args: argparse.Namespace) -> int:
    """``timeline SUMMARY.json``: the run drawn as a self-contained HTML page."""
    import json

    from ..guard.timeline import render

    try:
        with open(args.summary, encoding="utf-8") as source:
            summary = json.load(source)
    except OSError as exc:
        raise HpctorchError(f"cannot read {args.summary}: {exc.strerror}", "give the file hpctorch run --summary-json FILE wrote") from None
    except ValueError:
        raise HpctorchError(f"{args.summary} is not JSON", "give the file hpctorch run --summary-json FILE wrote") from None
    if not isinstance(summary, dict) or "nodes" not in summary or "wall_s" not in summary:
        raise HpctorchError(f"{args.summary} is not an hpctorch summary (no nodes, no wall_s)", "give the file hpctorch run --summary-json FILE wrote")
    try:
        drawn = render(summary)
    except (ValueError, TypeError, AttributeError) as exc:  # a field of another shape than run writes
        raise HpctorchError(f"{args.summary} is not an hpctorch summary ({exc})", "give the file hpctorch run --summary-json FILE wrote") from None
    output = args.output or os.path.splitext(args.summary)[0] + ".html"
    with open(output, "w", encoding="utf-8") as page:
        page.write(drawn)
    print(f"hpctorch: timeline of {len(summary['nodes'])} node(s) written to {output} (open it in a browser)", file=sys.stderr)
    return 0


def version_line() -> str:
    """hpctorch's version, the torch it would run (read without importing it) and the Python."""
    from .. import __file__ as package, __version__
    from ..storeclient import installed_torch

    torch = installed_torch()
    return (f"hpctorch {__version__} ({os.path.dirname(package)}), torch {torch or 'not installed'}, "
            f"Python {sys.version.split()[0]} ({sys.executable})")

"""torch's elastic agent's own lines about its workers, kept out of the user's way.

torch's agent logs each worker it stops (``W... Sending process 4242 closing signal SIGTERM``) and
each that failed (``E... failed (exitcode: 1) local_rank: 1 (pid: 4243) of binary: ...``), with
its own frames' file names: hpctorch's closing lines say the same, naming the rank, its node, the
exception and where. Those log records are dropped unless ``--verbose`` (``shown``); torch's
other loggers (rendezvous, the agent's restarts) are left as they are.
"""

from __future__ import annotations

import logging

WORKER_LOGS = "torch.distributed.elastic.multiprocessing"
"""The loggers of torch's worker processes' start, stop and exit (``multiprocessing.api``,
``.errors``, ``.tail_log``, ...), each made by torch's ``get_logger`` at its module's level."""
STOPPING = ("torch.distributed.elastic.agent.server.api", "Received %s death signal, shutting down workers")
"""The agent's line when hpctorch stops the node's workers (a SIGTERM to itself, on another node's
failure): hpctorch's own closing line says why (``stopped: ...``)."""
shown = False
"""``--verbose``: torch's lines are shown as torch prints them."""


class _Quiet(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.CRITICAL:
            return True
        return not (record.name == WORKER_LOGS or record.name.startswith(WORKER_LOGS + ".") or (record.name, record.msg) == STOPPING)


QUIET = _Quiet()


def quiet() -> None:
    """Drop torch's worker lines from here on (unless ``shown``). On the handlers, not the loggers:
    torch sets each module's logger's level as the module loads (``LOGLEVEL``), and its records
    reach the handlers torch's logging installs on its registered loggers (``torch.distributed``,
    ``torch``), or the root's where it installed none."""
    if shown:
        return
    parts = WORKER_LOGS.split(".")  # its ancestors hold the handlers of STOPPING's logger too
    for name in [".".join(parts[:n]) for n in range(len(parts), 0, -1)] + [""]:
        for handler in logging.getLogger(name).handlers:
            if QUIET not in handler.filters:
                handler.addFilter(QUIET)
    if logging.lastResort is not None and QUIET not in logging.lastResort.filters:
        logging.lastResort.addFilter(QUIET)

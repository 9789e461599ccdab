"""torch's agent's lines about its workers are dropped unless --verbose; its other lines are not."""

from __future__ import annotations

import logging

from hpctorch.start import torchlogs


def _record(name: str, msg: str, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord(name, level, "api.py", 1, msg, (15,), None)


def test_the_workers_lines_and_the_stop_are_dropped_and_the_rest_kept() -> None:
    assert not torchlogs.QUIET.filter(_record("torch.distributed.elastic.multiprocessing.api", "failed (exitcode: %s)", logging.ERROR))
    assert not torchlogs.QUIET.filter(_record("torch.distributed.elastic.agent.server.api", "Received %s death signal, shutting down workers"))
    assert torchlogs.QUIET.filter(_record("torch.distributed.elastic.agent.server.api", "Got termination signal: %s"))
    assert torchlogs.QUIET.filter(_record("torch.distributed.elastic.rendezvous.dynamic_rendezvous", "keep-alive %s"))
    assert torchlogs.QUIET.filter(_record("torch.distributed.elastic.multiprocessing.api", "fatal %s", logging.CRITICAL))

"""``python -m hpctorch.start.agent``: one simulated node's agent (see simulated.run_simulated)."""

from __future__ import annotations

import os
import sys

from .simulated import run_agent_from_env

if __name__ == "__main__":
    code = run_agent_from_env()
    # torch's agent is done and the summary said: skip the interpreter's teardown of torch.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

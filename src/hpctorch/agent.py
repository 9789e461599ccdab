"""``python -m hpctorch.agent``: one simulated node's agent (see simulated.run_simulated)."""

from __future__ import annotations

import sys

from .simulated import run_agent_from_env

if __name__ == "__main__":
    sys.exit(run_agent_from_env())

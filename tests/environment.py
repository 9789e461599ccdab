"""An environment outside any job, for the tests and the benchmarks (no pytest here)."""

from __future__ import annotations

import os

LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "PBS_", "LSB_", "FLUX_", "TORCHELASTIC_", "HPCTORCH_", "MV2_", "PALS_")
TORCH_VARS = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK"}


KEPT = {"HPCTORCH_BAD_NODES"}
"""The user's settings among HPCTORCH_*: the tests point the bad-node list at a file of their own
(tests/conftest.py), never the user's."""


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any launcher's variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k in KEPT or (not k.startswith(LAUNCHER_PREFIXES) and k not in TORCH_VARS)}
    env.update(extra)
    return env

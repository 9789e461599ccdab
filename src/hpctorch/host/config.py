"""Settings files: system-wide (the site's), the user's, or the one $HPCTORCH_CONFIG names.

TOML, the same keys everywhere:
    iface = "hsn0"            # interface name, glob or CIDR
    cpu_bind = "cores"        # none | cores | numa
    gpus_per_proc = 1
    profile = "polaris"       # force a site profile by name ("none": no profile)
    [env]                     # added to every worker's environment
    NCCL_NET_GDR_LEVEL = "PHB"
    [[sites]]                 # more site profiles, tried before the built-in ones
    name = "mycluster"
    clusters = ["mycluster"]
    hostnames = ["mc-*"]
    iface = "ib0"
    master_suffix = ""
    env = { NCCL_IB_HCA = "mlx5" }
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..errors import HpctorchError

SYSTEM_PATH = "/etc/hpctorch/config.toml"
KEYS = {"iface": str, "cpu_bind": str, "gpus_per_proc": int, "profile": str, "env": dict, "sites": list}


def user_path(env: Mapping[str, str]) -> str:
    if env.get("HPCTORCH_CONFIG"):
        return env["HPCTORCH_CONFIG"]
    base = env.get("XDG_CONFIG_HOME") or os.path.join(env.get("HOME", os.path.expanduser("~")), ".config")
    return os.path.join(base, "hpctorch", "config.toml")


def _read(path: str) -> dict[str, object] | None:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    import tomllib  # only when a file exists: planning stays fast without one

    try:
        parsed = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise HpctorchError(f"cannot read the settings file {path}: {exc}", "fix its TOML syntax, or move it away") from None
    for key, value in parsed.items():
        kind = KEYS.get(key)
        if kind is None:
            raise HpctorchError(f"unknown key {key!r} in {path}", f"use only {', '.join(KEYS)}")
        if not isinstance(value, kind):
            raise HpctorchError(f"{key} in {path} must be a {kind.__name__}, not {value!r}", "fix the value")
    return parsed


def load(env: Mapping[str, str], system_path: str = SYSTEM_PATH) -> dict[str, dict[str, object]]:
    """{"site": ..., "user": ...} for the files that exist; the key names the origin."""
    found = {}
    for origin, path in (("site", system_path), ("user", user_path(env))):
        data = _read(path)
        if data is not None:
            found[origin] = {**data, "_path": path}
        elif origin == "user" and env.get("HPCTORCH_CONFIG"):
            raise HpctorchError(f"HPCTORCH_CONFIG names {path}, which cannot be read", "fix the path, or unset HPCTORCH_CONFIG")
    return found

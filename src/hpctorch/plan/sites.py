"""Known machines' conventions, and how they combine with settings files, environment
variables and flags: flags > environment (HPCTORCH_*) > user file > site file > profile.

Each built-in profile cites the public documentation it follows. Profiles match by the
cluster name the machine publishes (SLURM_CLUSTER_NAME, NERSC_HOST, LMOD_SYSTEM_NAME,
SYSTEMNAME) or by host name pattern. A profile only fills what nothing else set.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import HpctorchError

CLUSTER_NAME_VARS = ("HPCTORCH_SITE", "SLURM_CLUSTER_NAME", "NERSC_HOST", "LMOD_SYSTEM_NAME", "SYSTEMNAME")


@dataclass(frozen=True)
class Profile:
    name: str
    clusters: tuple[str, ...] = ()
    hostnames: tuple[str, ...] = ()
    iface: str | None = None
    master_suffix: str = ""
    """Appended to node 0's host name to get its fabric address (JSC: ``jwb0001i``)."""
    env: Mapping[str, str] = field(default_factory=dict)
    docs: str = ""


BUILT_IN: tuple[Profile, ...] = (
    # NERSC Perlmutter: HPE Slingshot 11 (hsn0-hsn3), 4 NVIDIA A100 per GPU node.
    # https://docs.nersc.gov/systems/perlmutter/architecture/
    Profile("perlmutter", clusters=("perlmutter",), iface="hsn0",
            docs="https://docs.nersc.gov/systems/perlmutter/architecture/"),
    # OLCF Frontier: Slingshot (hsn0-hsn3), 4 AMD MI250X (8 GCDs) per node; RCCL over hsn.
    # https://docs.olcf.ornl.gov/systems/frontier_user_guide.html
    Profile("frontier", clusters=("frontier",), hostnames=("frontier*",), iface="hsn0",
            docs="https://docs.olcf.ornl.gov/systems/frontier_user_guide.html"),
    # CSC LUMI-G: Slingshot (hsn0-hsn3), 4 AMD MI250X per node; RCCL on every hsn interface.
    # https://github.com/Lumi-supercomputer/LUMI-AI-Guide (multi-node training section)
    Profile("lumi", clusters=("lumi",), iface="hsn0",
            env={"NCCL_SOCKET_IFNAME": "hsn0,hsn1,hsn2,hsn3"},
            docs="https://github.com/Lumi-supercomputer/LUMI-AI-Guide"),
    # ALCF Polaris (PBS, hosts x3xxxcXsXbXnX): Slingshot, 4 NVIDIA A100 per node.
    # https://docs.alcf.anl.gov/polaris/applications-and-libraries/libraries/nccl/
    Profile("polaris", clusters=("polaris",), hostnames=("x3*c*s*b*n*",), iface="hsn0",
            env={"NCCL_NET_GDR_LEVEL": "PHB", "NCCL_CROSS_NIC": "1"},
            docs="https://docs.alcf.anl.gov/polaris/applications-and-libraries/libraries/nccl/"),
    # ALCF Aurora (PBS, hosts x4xxxcXsXbXnX): Slingshot, 6 Intel Data Center GPU Max per node.
    # https://docs.alcf.anl.gov/aurora/data-science/frameworks/pytorch/
    Profile("aurora", clusters=("aurora",), hostnames=("x4*c*s*b*n*",), iface="hsn0",
            docs="https://docs.alcf.anl.gov/aurora/data-science/frameworks/pytorch/"),
    # JSC JUWELS Booster / JURECA-DC: InfiniBand; a node's name plus "i" resolves to its IB address.
    # https://apps.fz-juelich.de/jsc/hps/juwels/booster-overview.html
    Profile("juwels-booster", clusters=("juwelsbooster", "juwels"), hostnames=("jwb*",), iface="ib*", master_suffix="i", docs="https://apps.fz-juelich.de/jsc/hps/juwels/booster-overview.html"),
    Profile("jureca-dc", clusters=("jurecadc", "jureca"), hostnames=("jrc*",), iface="ib*", master_suffix="i", docs="https://apps.fz-juelich.de/jsc/hps/jureca/"),
)


@dataclass(frozen=True)
class Settings:
    """The effective settings, each with where it came from."""

    iface: str | None = None
    cpu_bind: str | None = None
    gpus_per_proc: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    profile: Profile | None = None
    origins: Mapping[str, str] = field(default_factory=dict)

    @property
    def master_suffix(self) -> str:
        return self.profile.master_suffix if self.profile else ""


def _profile_from(entry: Mapping[str, object], origin: str) -> Profile:
    try:
        return Profile(
            name=str(entry["name"]),
            clusters=tuple(entry.get("clusters", ())),  # type: ignore[arg-type]
            hostnames=tuple(entry.get("hostnames", ())),  # type: ignore[arg-type]
            iface=entry.get("iface"),  # type: ignore[arg-type]
            master_suffix=str(entry.get("master_suffix", "")),
            env={str(k): str(v) for k, v in dict(entry.get("env", {})).items()},  # type: ignore[call-overload]
            docs=f"from {origin}",
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise HpctorchError(f"a [[sites]] entry in {origin} is malformed ({exc})", "give it at least name = \"...\"") from None


def match(env: Mapping[str, str], hostname: str, profiles: Sequence[Profile], forced: str | None = None) -> tuple[Profile | None, str]:
    """The profile for this machine and why; ``forced`` names one ("none": no profile)."""
    if forced:
        if forced == "none":
            return None, "profile = none"
        for profile in profiles:
            if profile.name == forced:
                return profile, f"profile = {forced}"
        raise HpctorchError(f"no site profile is named {forced!r}", f"choose one of: {', '.join(p.name for p in profiles)}, none")
    names = {var: env[var].lower() for var in CLUSTER_NAME_VARS if env.get(var)}
    for profile in profiles:
        for var, name in names.items():
            if name in profile.clusters:
                return profile, f"{var}={name}"
    short = hostname.split(".")[0]
    for profile in profiles:
        for pattern in profile.hostnames:
            if fnmatch.fnmatchcase(short, pattern):
                return profile, f"host name {short} matches {pattern}"
    return None, ""


def resolve(flags: Mapping[str, object], env: Mapping[str, str], hostname: str, files: Mapping[str, Mapping[str, object]]) -> Settings:
    """Combine flags, HPCTORCH_* variables, the user's and the site's files, and the profile."""
    layers: list[tuple[str, Mapping[str, object]]] = [("flag", {k: v for k, v in flags.items() if v is not None})]
    from_env: dict[str, object] = {}
    for key, var in (("iface", "HPCTORCH_IFACE"), ("cpu_bind", "HPCTORCH_CPU_BIND"), ("profile", "HPCTORCH_PROFILE")):
        if env.get(var):
            from_env[key] = env[var]
    if env.get("HPCTORCH_GPUS_PER_PROC"):
        try:
            from_env["gpus_per_proc"] = int(env["HPCTORCH_GPUS_PER_PROC"])
        except ValueError:
            raise HpctorchError(f"HPCTORCH_GPUS_PER_PROC={env['HPCTORCH_GPUS_PER_PROC']!r} is not a count", "give a number") from None
    layers.append(("environment", from_env))
    for origin in ("user", "site"):
        if origin in files:
            layers.append((f"{origin} file {files[origin].get('_path')}", files[origin]))
    extra = [_profile_from(e, str(f.get("_path"))) for o in ("user", "site") if o in files for f in (files[o],) for e in f.get("sites", [])]  # type: ignore[union-attr]
    forced = next((layer["profile"] for _, layer in layers if "profile" in layer), None)
    profile, why = match(env, hostname, [*extra, *BUILT_IN], str(forced) if forced else None)
    values: dict[str, object] = {}
    origins: dict[str, str] = {}
    for key in ("iface", "cpu_bind", "gpus_per_proc"):
        for origin, layer in layers:
            if layer.get(key) is not None:
                values[key], origins[key] = layer[key], origin
                break
        else:
            if key == "iface" and profile and profile.iface:
                values[key], origins[key] = profile.iface, f"site profile {profile.name} ({why})"
    merged_env: dict[str, str] = {}
    env_origins: dict[str, str] = {}
    if profile:
        for var, value in profile.env.items():
            merged_env[var], env_origins[var] = value, f"site profile {profile.name} ({profile.docs})"
    for origin, layer in reversed(layers):  # later layers (site, then user) override the profile
        for var, value in dict(layer.get("env", {})).items():  # type: ignore[call-overload]
            merged_env[str(var)], env_origins[str(var)] = str(value), origin
    if profile:
        origins["profile"] = f"{profile.name} ({why}; {profile.docs})"
    origins.update({f"env {k}": v for k, v in env_origins.items()})
    return Settings(values.get("iface"), values.get("cpu_bind"), values.get("gpus_per_proc"), merged_env, profile, origins)  # type: ignore[arg-type]

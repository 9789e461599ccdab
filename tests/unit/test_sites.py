"""Site profiles and settings files: matching, precedence (flags > env > user > site > profile), explain."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctorch import Options, make_plan
from hpctorch.errors import HpctorchError
from hpctorch.host import config
from hpctorch.plan.render import table
from hpctorch.schedulers import detect

from .helpers import LO, MGMT, facts, iface

IB = iface("ib0", "10.20.0.2/16")
SLURM = {"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_STEP_NODELIST": "n[1-2]",
         "SLURM_NNODES": "2", "SLURM_STEP_NUM_NODES": "2", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2",
         "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
         "SLURM_TASKS_PER_NODE": "1(x2)", "SLURMD_NODENAME": "n2"}
HSN = iface("hsn0", "198.18.0.2/24")


def plan_for(env: dict[str, str], files: dict | None = None, options: Options | None = None, hostname: str = "n2", **extra: object):  # type: ignore[no-untyped-def]
    merged = {**SLURM, **env}
    values: dict[str, object] = {"interfaces": (LO, MGMT, HSN, IB), "resolved": {"n1": ("198.18.0.1", "10.20.0.1", "198.19.0.1")}}
    values.update(extra)
    host_facts = facts(env=merged, hostname=hostname, config=files or {}, **values)
    return make_plan(detect(merged), options or Options(command=("x",)), host_facts)


def test_cluster_name_selects_the_profile_and_its_environment() -> None:
    plan = plan_for({"SLURM_CLUSTER_NAME": "polaris"})
    assert plan.iface == "hsn0"
    assert plan.common_env["NCCL_NET_GDR_LEVEL"] == "PHB" and plan.common_env["NCCL_CROSS_NIC"] == "1"
    assert plan.sources["profile"].startswith("polaris (SLURM_CLUSTER_NAME=polaris;")
    text = table(plan, explain=True)
    assert "  site        polaris" in text and "docs.alcf.anl.gov" in text


def test_host_name_pattern_selects_a_profile() -> None:
    plan = plan_for({}, hostname="x3006c0s13b0n0")
    assert plan.sources["profile"].startswith("polaris (host name x3006c0s13b0n0 matches x3*c*s*b*n*")


def test_the_users_environment_wins_over_the_profile() -> None:
    plan = plan_for({"SLURM_CLUSTER_NAME": "polaris", "NCCL_CROSS_NIC": "0"})
    assert "NCCL_CROSS_NIC" not in plan.common_env
    assert "kept NCCL_CROSS_NIC=0 from the environment" in plan.reasons["NCCL_CROSS_NIC"]


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_precedence_flag_env_user_site_profile(tmp_path: Path) -> None:
    site = _write(tmp_path / "site.toml", 'iface = "mgmt0"\ncpu_bind = "numa"\n[env]\nNCCL_DEBUG = "WARN"\nFROM_SITE = "1"\n')
    user = _write(tmp_path / "user.toml", 'iface = "ib0"\n[env]\nNCCL_DEBUG = "INFO"\n')
    files = config.load({"HPCTORCH_CONFIG": user}, system_path=site)
    cluster = {"SLURM_CLUSTER_NAME": "polaris"}
    plan = plan_for(cluster, files)
    assert plan.iface == "ib0" and plan.sources["iface"].startswith("user file")
    assert plan.common_env["NCCL_DEBUG"] == "INFO" and plan.common_env["FROM_SITE"] == "1"
    assert plan.sources["cpu_bind"].startswith("site file") and plan.reasons["cpu_bind"].startswith("numa")
    assert plan_for({**cluster, "HPCTORCH_IFACE": "mgmt0"}, files).iface == "mgmt0"
    assert plan_for({**cluster, "HPCTORCH_IFACE": "mgmt0"}, files, Options(iface="hsn0", command=("x",))).iface == "hsn0"
    site_only = config.load({"HOME": str(tmp_path / "nohome")}, system_path=site)
    assert plan_for(cluster, site_only).iface == "mgmt0"
    assert plan_for(cluster, {}).iface == "hsn0"  # the profile's


def test_a_user_site_entry_and_a_forced_profile(tmp_path: Path) -> None:
    user = _write(tmp_path / "user.toml", 'profile = "lab"\n[[sites]]\nname = "lab"\nclusters = ["lab"]\niface = "ib*"\nenv = { NCCL_IB_HCA = "mlx5" }\n')
    plan = plan_for({}, config.load({"HPCTORCH_CONFIG": user}, system_path=str(tmp_path / "none")))
    assert plan.iface == "ib0" and plan.common_env["NCCL_IB_HCA"] == "mlx5"
    with pytest.raises(HpctorchError, match="no site profile is named 'nope'"):
        plan_for({"HPCTORCH_PROFILE": "nope"})


def test_a_profiles_interface_that_is_missing_falls_back_to_the_automatic_choice() -> None:
    plan = plan_for({"SLURM_CLUSTER_NAME": "juwelsbooster"}, interfaces=(LO, MGMT, HSN))
    assert plan.iface == "hsn0" and "names ib*, which is not here" in plan.reasons["iface"]


def test_juwels_suffix_names_the_masters_infiniband_address() -> None:
    env = {**SLURM, "SLURM_JOB_NODELIST": "jwb[0001-0002]", "SLURM_STEP_NODELIST": "jwb[0001-0002]", "SLURMD_NODENAME": "jwb0002",
           "SLURM_CLUSTER_NAME": "juwelsbooster"}
    host_facts = facts(env=env, hostname="jwb0002", interfaces=(LO, MGMT, IB),
                       resolved={"jwb0001": ("198.19.0.1",), "jwb0001i": ("10.20.0.1",)})
    plan = make_plan(detect(env), Options(command=("x",)), host_facts)
    assert plan.master_addr == "10.20.0.1" and plan.iface == "ib0"


def test_bad_settings_files_are_one_clear_error(tmp_path: Path) -> None:
    bad = _write(tmp_path / "bad.toml", "iface = \n")
    with pytest.raises(HpctorchError, match="cannot read the settings file"):
        config.load({"HPCTORCH_CONFIG": bad}, system_path=str(tmp_path / "none"))
    unknown = _write(tmp_path / "unknown.toml", 'ifcae = "hsn0"\n')
    with pytest.raises(HpctorchError, match="unknown key 'ifcae'"):
        config.load({"HPCTORCH_CONFIG": unknown}, system_path=str(tmp_path / "none"))
    with pytest.raises(HpctorchError, match="HPCTORCH_CONFIG names"):
        config.load({"HPCTORCH_CONFIG": str(tmp_path / "missing.toml")}, system_path=str(tmp_path / "none"))

"""PBS, LSF, Flux, SGE and Kubeflow, from the variables their documentation lists
(each module's docstring cites its page); host files are written as the systems write them."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctorch import Options, make_plan
from hpctorch.errors import HpctorchError
from hpctorch.schedulers import detect
from hpctorch.schedulers.allocation import Launched

from .helpers import facts


def slot_file(tmp_path: Path, name: str, lines: list[str]) -> str:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def test_pbs_under_pbsdsh_one_per_node(tmp_path: Path) -> None:
    nodefile = slot_file(tmp_path, "nodefile", ["n01"] * 4 + ["n02"] * 4)
    a = detect({"PBS_JOBID": "4242.pbs01", "PBS_NODEFILE": nodefile, "PBS_NODENUM": "1", "PBS_O_WORKDIR": "/home/u/run"})
    assert (a.scheduler, a.nodes, a.tasks_per_node, a.node_rank, a.slots_per_node, a.submit_dir) == (
        "pbs", ("n01", "n02"), (1, 1), 1, None, "/home/u/run")
    # PBS_NODEFILE's lines are CPUs (mpiprocs, ppn), not workers: one per visible GPU.
    plan = make_plan(a, Options(command=("x",)), facts(resolved={"n01": ("198.18.0.1",)}, gpus=("0", "1", "2", "3")))
    assert (plan.mode, plan.world_size, [w.rank for w in plan.workers]) == ("per-node", 8, [4, 5, 6, 7])


def test_pbs_slots_are_cpus_not_workers(tmp_path: Path) -> None:
    torque = slot_file(tmp_path, "torque", ["n01"] * 32)  # -l nodes=1:ppn=32
    one = detect({"PBS_JOBID": "5.torque", "PBS_NODEFILE": torque})
    assert make_plan(one, Options(command=("x",)), facts()).nproc_per_node == (1,)  # not 32
    pro = slot_file(tmp_path, "pro", ["x3001c0s1b0n0"])  # -l select=1:ncpus=64:ngpus=4, mpiprocs=1
    gpus = detect({"PBS_JOBID": "6.polaris", "PBS_NODEFILE": pro})
    assert make_plan(gpus, Options(command=("x",)), facts(gpus=("0", "1", "2", "3"))).nproc_per_node == (4,)


def test_pbs_job_script_on_several_nodes_says_how_to_launch(tmp_path: Path) -> None:
    nodefile = slot_file(tmp_path, "nodefile", ["n01", "n02"])
    with pytest.raises(HpctorchError, match="pbsdsh -u hpctorch run"):
        detect({"PBS_JOBID": "1", "PBS_NODEFILE": nodefile})
    with pytest.raises(HpctorchError, match="PBS_NODEFILE is not"):
        detect({"PBS_JOBID": "1"})
    with pytest.raises(HpctorchError, match="cannot be read"):
        detect({"PBS_JOBID": "1", "PBS_NODEFILE": str(tmp_path / "missing")})


def test_pbs_job_script_relaunches_itself_with_pals_mpiexec(tmp_path: Path) -> None:
    # HPE Cray EX (Polaris, Aurora): PALS's mpiexec on PATH passes the environment and the
    # working directory on, so the job script may start one hpctorch per node itself.
    nodefile = slot_file(tmp_path, "nodefile", ["x3001c0s1b0n0", "x3001c0s1b1n0", "x3001c0s7b0n0"])
    env = {"PBS_JOBID": "123.polaris-pbs-01", "PBS_NODEFILE": nodefile, "PBS_O_WORKDIR": "/eagle/u",
           "PATH": "/opt/cray/pals/1.3.4/bin:/usr/bin"}
    a = detect(env)
    assert (a.launched, a.nodes, a.relaunch_command()) == (Launched.BATCH, ("x3001c0s1b0n0", "x3001c0s1b1n0", "x3001c0s7b0n0"),
                                                          ("mpiexec", "-n", "3", "--ppn", "1"))
    plan = make_plan(a, Options(command=("x",)), facts())
    assert plan.mode == "relaunch" and plan.relaunch == ("mpiexec", "-n", "3", "--ppn", "1")


def test_lsf_under_jsrun(tmp_path: Path) -> None:
    rankfile = slot_file(tmp_path, "rankfile", ["h41n01"] * 6 + ["h41n02"] * 6)
    env = {"LSB_JOBID": "777", "LSB_DJOB_RANKFILE": rankfile, "LS_SUBCWD": "/gpfs/u",
           "JSM_NAMESPACE_RANK": "7", "JSM_NAMESPACE_SIZE": "12", "JSM_NAMESPACE_LOCAL_RANK": "1", "JSM_NAMESPACE_LOCAL_SIZE": "6"}
    a = detect(env)
    assert (a.scheduler, a.nodes, a.tasks_per_node, a.task_rank, a.node_rank, a.local_task_rank, a.launched is Launched.RANKS) == (
        "lsf", ("h41n01", "h41n02"), (6, 6), 7, 1, 1, True)


def test_lsf_leaves_out_the_launch_node(tmp_path: Path) -> None:
    # As on OLCF Summit: the batch (launch) node first, once; it runs no rank.
    rankfile = slot_file(tmp_path, "rankfile", ["batch3"] + ["h41n01"] * 6 + ["h41n02"] * 6)
    env = {"LSB_JOBID": "778", "LSB_DJOB_RANKFILE": rankfile, "JSM_NAMESPACE_RANK": "0", "JSM_NAMESPACE_SIZE": "12",
           "JSM_NAMESPACE_LOCAL_RANK": "0", "JSM_NAMESPACE_LOCAL_SIZE": "6"}
    a = detect(env)
    assert (a.nodes, a.tasks_per_node, a.node_rank) == (("h41n01", "h41n02"), (6, 6), 0)
    plan = make_plan(a, Options(command=("x",)), facts(hostname="h41n01", resolved={"h41n01": ("198.18.0.1",)}))
    assert plan.nodes[0] == "h41n01"
    assert detect({"LSB_JOBID": "9", "LSB_MCPU_HOSTS": "batch1 1 h1 42"}).nodes == ("h1",)


def test_lsf_single_node_from_mcpu_hosts() -> None:
    a = detect({"LSB_JOBID": "9", "LSB_MCPU_HOSTS": "h1 4"})
    assert (a.nodes, a.slots_per_node) == (("h1",), None)
    with pytest.raises(HpctorchError, match="jsrun -r 1"):
        detect({"LSB_JOBID": "9", "LSB_MCPU_HOSTS": "h1 4 h2 4"})


def test_flux_run_needs_the_allgather() -> None:
    env = {"FLUX_JOB_ID": "ƒ2Wb7u5TKP", "FLUX_TASK_RANK": "5", "FLUX_TASK_LOCAL_ID": "1", "FLUX_JOB_SIZE": "8", "FLUX_JOB_NNODES": "2", "PMI_RANK": "5", "PMI_SIZE": "8"}
    a = detect(env)
    assert (a.scheduler, a.task_rank, a.local_task_rank, a.tasks_per_node, a.launched is Launched.UNNAMED) == ("flux", 5, 1, (4, 4), True)
    assert detect({**env, "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"}).scheduler == "openmpi"


def test_sge_single_host_and_several(tmp_path: Path) -> None:
    pe = slot_file(tmp_path, "pe", ["h1 8 all.q@h1 UNDEFINED"])
    a = detect({"JOB_ID": "31", "PE_HOSTFILE": pe, "NSLOTS": "8", "SGE_O_WORKDIR": "/w"})
    assert (a.scheduler, a.nodes, a.slots_per_node) == ("sge", ("h1",), None)
    # Slots are CPUs, not workers: one per visible GPU, else one.
    assert make_plan(a, Options(command=("x",)), facts()).nproc_per_node == (1,)
    pe2 = slot_file(tmp_path, "pe2", ["h1 8 q UNDEFINED", "h2 8 q UNDEFINED"])
    with pytest.raises(HpctorchError, match="qrsh -inherit"):
        detect({"JOB_ID": "31", "PE_HOSTFILE": pe2})
    assert detect({"JOB_ID": "31"}).scheduler == "local"  # JOB_ID alone is not SGE


def test_kubeflow_pytorchjob_rank_is_the_pod() -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2"}
    a = detect(env)
    assert (a.scheduler, a.tasks_per_node, a.node_rank, a.master_addr, a.master_port) == ("kubeflow", (1, 1, 1), 2, "job-master-0", 23456)
    plan = make_plan(a, Options(nproc_per_node=4, command=("x",)), facts())
    assert (plan.mode, plan.world_size, plan.node_rank, [w.rank for w in plan.workers]) == ("per-node", 12, 2, [8, 9, 10, 11])
    pet = detect({"KUBERNETES_SERVICE_HOST": "x", "PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "m", "PET_MASTER_PORT": "1"})
    assert (pet.tasks_per_node, pet.node_rank, pet.sources["node_rank"]) == ((1, 1), 1, "PET_NODE_RANK")

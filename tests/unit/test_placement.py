"""GPU and CPU placement on fake sysfs trees: 4 GPUs on 2 NUMA nodes, MIG, UUIDs, AMD, per-task binding."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctorch import Options, make_plan
from hpctorch.errors import HpctorchError
from hpctorch.host import affinity, devices
from hpctorch.schedulers import detect

from .helpers import facts

BUS = ["0000:07:00.0", "0000:0b:00.0", "0000:48:00.0", "0000:4c:00.0"]  # two per NUMA node


def fake_node(root: Path, numa_of_gpu: list[int] = [0, 0, 1, 1], cpus: int = 16) -> Path:  # noqa: B006
    for bus, numa in zip(BUS, numa_of_gpu):
        (root / "proc/driver/nvidia/gpus" / bus).mkdir(parents=True)
        pci = root / "sys/bus/pci/devices" / bus
        pci.mkdir(parents=True)
        (pci / "numa_node").write_text(f"{numa}\n")
    half = cpus // 2
    for node, (low, high) in enumerate([(0, half - 1), (half, cpus - 1)]):
        path = root / "sys/devices/system/node" / f"node{node}"
        path.mkdir(parents=True)
        (path / "cpulist").write_text(f"{low}-{high}\n")
    for cpu in range(cpus):
        topo = root / "sys/devices/system/cpu" / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        # Hyperthreads: cpu c and c + cpus/4 share a core within each NUMA half... keep it simple:
        # two threads per core, siblings adjacent (c, c^1).
        (topo / "core_id").write_text(f"{cpu // 2}\n")
        (topo / "physical_package_id").write_text(f"{cpu // half}\n")
    (root / "sys/devices/system/cpu/online").write_text(f"0-{cpus - 1}\n")
    return root


def node_facts(root: Path, env: dict[str, str] | None = None, allowed: range = range(16)) -> object:
    env = env or {}
    found = devices.gpus(env, str(root))
    topology = affinity.read_topology(str(root), allowed=list(allowed))
    return facts(env=env, gpus=found.ids, gpu_numa=found.numa, gpu_source=found.source,
                 topology=topology, cpus=len(topology.allowed), resolved={"n1": ("198.18.0.1",)})


def test_four_gpus_on_two_numa_nodes_one_worker_each(tmp_path: Path) -> None:
    plan = make_plan(detect({}), Options(command=("x",)), node_facts(fake_node(tmp_path)))
    assert [w.env["HPCTORCH_DEVICES"] for w in plan.workers] == ["0", "1", "2", "3"]
    # GPUs 0,1 on NUMA 0 (CPUs 0-7), GPUs 2,3 on NUMA 1 (CPUs 8-15); whole cores (pairs) stay together.
    assert [w.env["HPCTORCH_CPUS"] for w in plan.workers] == ["0-3", "4-7", "8-11", "12-15"]
    assert [w.env["OMP_NUM_THREADS"] for w in plan.workers] == ["4", "4", "4", "4"]
    assert plan.common_env["HPCTORCH_CPU_SETS"] == "0-3;4-7;8-11;12-15"


def test_gpu_numa_decides_the_cpus_even_when_gpus_are_interleaved(tmp_path: Path) -> None:
    plan = make_plan(detect({}), Options(command=("x",)), node_facts(fake_node(tmp_path, numa_of_gpu=[1, 0, 1, 0])))
    assert [w.env["HPCTORCH_CPUS"] for w in plan.workers] == ["8-11", "0-3", "12-15", "4-7"]


def test_two_gpus_per_process_and_numa_binding(tmp_path: Path) -> None:
    plan = make_plan(detect({}), Options(gpus_per_proc=2, cpu_bind="numa", command=("x",)), node_facts(fake_node(tmp_path)))
    assert len(plan.workers) == 2
    assert [w.env["HPCTORCH_DEVICES"] for w in plan.workers] == ["0,1", "2,3"]
    assert [w.env["HPCTORCH_CPUS"] for w in plan.workers] == ["0-7", "8-15"]


def test_impossible_request_shows_the_arithmetic(tmp_path: Path) -> None:
    with pytest.raises(HpctorchError, match=r"3 processes x 2 GPU\(s\) = 6 GPUs, but 4 visible"):
        make_plan(detect({}), Options(nproc_per_node=3, gpus_per_proc=2, command=("x",)), node_facts(fake_node(tmp_path)))


def test_cuda_visible_devices_narrows_and_keeps_numa(tmp_path: Path) -> None:
    plan = make_plan(detect({}), Options(command=("x",)), node_facts(fake_node(tmp_path), {"CUDA_VISIBLE_DEVICES": "2,3"}))
    assert [w.env["HPCTORCH_DEVICES"] for w in plan.workers] == ["0", "1"]
    assert [w.env["HPCTORCH_CPUS"] for w in plan.workers] == ["8-11", "12-15"]


def test_constrained_devices_count_within_the_jobs_gpus(tmp_path: Path) -> None:
    # ConstrainDevices=yes: the job got physical GPUs 2,3 (NUMA 1); CUDA sees them as 0,1.
    env = {"SLURM_STEP_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "0,1"}
    found = devices.gpus(env, str(fake_node(tmp_path)))
    assert (found.ids, found.numa) == (("0", "1"), (1, 1))
    plan = make_plan(detect({}), Options(command=("x",)), node_facts(tmp_path, env))
    assert [w.env["HPCTORCH_CPUS"] for w in plan.workers] == ["8-11", "12-15"]
    # Without it Slurm exports the machine-wide indices in both: the same GPUs.
    assert devices.gpus({"SLURM_STEP_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "2,3"}, str(tmp_path)).numa == (1, 1)


def test_uuid_and_mig_ids_count_but_have_no_numa(tmp_path: Path) -> None:
    env = {"CUDA_VISIBLE_DEVICES": "MIG-4f5e6a7b-1111-2222-3333-444455556666,MIG-4f5e6a7b-1111-2222-3333-444455556667,GPU-8a1b"}
    found = devices.gpus(env, str(fake_node(tmp_path)))
    assert found.ids == tuple(env["CUDA_VISIBLE_DEVICES"].split(",")) and found.numa == (None, None, None)
    plan = make_plan(detect({}), Options(command=("x",)), node_facts(tmp_path, env))
    assert [w.env["HPCTORCH_DEVICES"] for w in plan.workers] == ["0", "1", "2"]
    assert [w.env["HPCTORCH_CPUS"] for w in plan.workers] == ["0-3", "4-9", "10-15"]  # core order: 8 cores as 2+3+3


def test_amd_gpus_from_kfd_and_rocr(tmp_path: Path) -> None:
    for node, gpu_id in enumerate(["0", "123", "456"]):  # kfd node 0 is the CPU
        path = tmp_path / "sys/class/kfd/kfd/topology/nodes" / str(node)
        path.mkdir(parents=True)
        (path / "gpu_id").write_text(gpu_id)
    assert devices.gpus({}, str(tmp_path)).ids == ("0", "1")
    assert devices.gpus({}, str(tmp_path)).vendor == "amd"
    assert devices.gpus({"ROCR_VISIBLE_DEVICES": "1"}, str(tmp_path)).ids == ("1",)
    assert devices.gpus({"ROCR_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "1"}, str(tmp_path)).ids == ("1",)


def test_slurm_step_gpus_without_cuda_visible_devices(tmp_path: Path) -> None:
    found = devices.gpus({"SLURM_STEP_GPUS": "2,3"}, str(fake_node(tmp_path)))
    assert found.ids == ("0", "1") and found.numa == (1, 1)


def _srun_task(local: int, cuda: str | None) -> tuple[dict[str, str], dict[str, str]]:
    env = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_STEP_NODELIST": "n[1-2]",
           "SLURM_NNODES": "2", "SLURM_STEP_NUM_NODES": "2", "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "8",
           "SLURM_PROCID": str(4 + local), "SLURM_LOCALID": str(local), "SLURM_NODEID": "1",
           "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_TASKS_PER_NODE": "4(x2)", "SLURMD_NODENAME": "n2"}
    if cuda is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda
    return env, env


def test_per_task_bound_gpu_gives_device_zero(tmp_path: Path) -> None:
    env, _ = _srun_task(3, "3")  # srun --gpus-per-task=1: task 3 sees only its GPU
    plan = make_plan(detect(env), Options(command=("x",)), node_facts(fake_node(tmp_path), env, allowed=range(12, 16)))
    worker = plan.workers[0]
    assert worker.env["LOCAL_RANK"] == "0" and worker.env["HPCTORCH_LOCAL_TASK_RANK"] == "3"
    assert worker.env["HPCTORCH_DEVICES"] == "0" and worker.env["RANK"] == "7"
    assert "HPCTORCH_CPUS" not in worker.env and worker.env["OMP_NUM_THREADS"] == "4"  # srun bound its CPUs already
    assert "LOCAL_RANK=0" in plan.reasons["devices"]


def test_per_task_seeing_all_gpus_uses_its_local_rank(tmp_path: Path) -> None:
    env, _ = _srun_task(2, "0,1,2,3")
    plan = make_plan(detect(env), Options(command=("x",)), node_facts(fake_node(tmp_path), env))
    worker = plan.workers[0]
    assert worker.env["LOCAL_RANK"] == "2" and worker.env["HPCTORCH_DEVICES"] == "2"
    assert worker.env["HPCTORCH_CPUS"] == "8-11"  # unbound task: its share, on its GPU's NUMA node


def test_per_task_with_an_odd_gpu_count_is_refused(tmp_path: Path) -> None:
    env, _ = _srun_task(1, "0,1")
    with pytest.raises(HpctorchError, match="neither the node's 4 x 1 = 4 nor its own 1"):
        make_plan(detect(env), Options(command=("x",)), node_facts(fake_node(tmp_path), env))


def test_cgroup_quota_caps_threads(tmp_path: Path) -> None:
    fake_node(tmp_path)
    (tmp_path / "sys/fs/cgroup").mkdir(parents=True)
    (tmp_path / "sys/fs/cgroup/cpu.max").write_text("400000 100000\n")
    plan = make_plan(detect({}), Options(command=("x",)), node_facts(tmp_path))
    assert [w.env["OMP_NUM_THREADS"] for w in plan.workers] == ["1", "1", "1", "1"]  # 4 CPUs' worth among 4


def test_cpulist_round_trip() -> None:
    assert affinity.parse_cpulist("0-3,8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert affinity.format_cpulist([11, 10, 8, 3, 2, 1, 0]) == "0-3,8,10-11"

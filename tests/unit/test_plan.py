"""make_plan: every field, for the environments users meet."""

from __future__ import annotations

import json

import pytest

from hpctorch import Options, Plan, make_plan
from hpctorch.errors import HpctorchError
from hpctorch.plan.render import table
from hpctorch.schedulers import detect, slurm
from hpctorch.schedulers import local as local_launcher
from hpctorch.schedulers.allocation import Allocation

from .helpers import facts

PY = ("python", "-u", "train.py")


def local(host: str = "node2") -> Allocation:
    return Allocation(launcher=local_launcher.LAUNCHER, nodes=(host,), tasks_per_node=(1,), task_rank=0, node_rank=0, local_task_rank=0)


def test_single_node_default_is_one_worker_on_loopback_with_os_chosen_port() -> None:
    plan = make_plan(local(), Options(command=PY), facts())
    assert plan.mode == "per-node"
    assert (plan.nnodes, plan.node_rank, plan.nproc_per_node, plan.world_size) == (1, 0, (1,), 1)
    assert (plan.master_addr, plan.master_port, plan.rdzv_backend) == ("127.0.0.1", 0, "c10d")
    assert plan.iface == "lo"
    assert plan.common_env == {
        "GLOO_SOCKET_IFNAME": "lo",
        "NCCL_SOCKET_IFNAME": "=lo",
        "HPCTORCH_IFACE": "lo",
        "OMP_NUM_THREADS": "8",
        "HPCTORCH_SCHEDULER": "local",
        "HPCTORCH_NODELIST": "node2",
    }
    (worker,) = plan.workers
    assert (worker.rank, worker.local_rank) == (0, 0)
    # Per node, torch's agent sets the torch variables; the plan claims only what hpctorch sets.
    assert "RANK" not in worker.env and "MASTER_PORT" not in worker.env
    assert "torch's elastic agent sets each worker's RANK" in table(plan)
    assert plan.command == PY


def test_one_worker_per_visible_gpu_by_default() -> None:
    plan = make_plan(local(), Options(command=PY), facts(gpus=("0", "1", "2", "3")))
    assert plan.nproc_per_node == (4,)
    assert [w.local_rank for w in plan.workers] == [0, 1, 2, 3]
    assert [w.env["HPCTORCH_DEVICES"] for w in plan.workers] == ["0", "1", "2", "3"]
    assert plan.common_env["OMP_NUM_THREADS"] == "2"
    assert "visible GPU" in plan.reasons["nproc_per_node"]


def test_explicit_multi_node_flags_like_torchrun() -> None:
    options = Options(nnodes=2, node_rank=1, nproc_per_node=2, master_addr="198.18.0.1", master_port=29400, command=PY)
    plan = make_plan(local(), options, facts())
    assert (plan.mode, plan.nnodes, plan.node_rank, plan.world_size) == ("per-node", 2, 1, 4)
    assert (plan.master_addr, plan.master_port, plan.rdzv_backend) == ("198.18.0.1", 29400, "static")
    assert plan.iface == "hsn0"  # a fast fabric beats the default-route management net
    assert [w.rank for w in plan.workers] == [2, 3]
    assert [w.local_rank for w in plan.workers] == [0, 1]
    env = plan.workers[1].env
    assert env["GLOO_SOCKET_IFNAME"] == "hsn0" and env["NCCL_SOCKET_IFNAME"] == "=hsn0"


def test_master_node_advertises_its_fabric_address() -> None:
    plan = make_plan(local(), Options(nnodes=2, node_rank=0, master_port=29400, command=PY), facts())
    assert plan.master_addr == "198.18.0.2"
    assert "rank 0" in plan.reasons["master_addr"]


def test_iface_by_cidr_and_glob() -> None:
    for spec in ("198.19.0.0/16", "mgmt*", "mgmt0"):
        plan = make_plan(local(), Options(nnodes=2, node_rank=0, master_port=1, iface=spec, command=PY), facts())
        assert plan.iface == "mgmt0" and plan.master_addr == "198.19.0.2", spec


def test_unknown_iface_lists_the_choices() -> None:
    with pytest.raises(HpctorchError) as error:
        make_plan(local(), Options(nnodes=2, node_rank=0, master_port=1, iface="eth9", command=PY), facts())
    assert "eth9" in error.value.cause and "hsn0 (198.18.0.2/24)" in error.value.fix


def test_multi_node_without_node_rank_is_refused() -> None:
    with pytest.raises(HpctorchError) as error:
        make_plan(local(), Options(nnodes=2, command=PY), facts())
    assert "--nnodes 2" in error.value.cause and "--node-rank" in error.value.fix


def test_worker_node_without_master_address_is_refused() -> None:
    with pytest.raises(HpctorchError, match="nothing names the master"):
        make_plan(local(), Options(nnodes=2, node_rank=1, master_port=1, command=PY), facts())


def test_per_task_from_torch_variables_sets_only_what_is_missing() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "198.18.0.1", "MASTER_PORT": "1234"}
    allocation = detect(env)
    assert (allocation.scheduler, allocation.task_rank, allocation.node_rank, allocation.tasks_per_node) == ("env", 3, 1, (2, 2))
    plan = make_plan(allocation, Options(command=PY), facts(env=env))
    assert (plan.mode, plan.node_rank, plan.world_size, plan.master_addr, plan.master_port) == ("per-task", 1, 4, "198.18.0.1", 1234)
    (worker,) = plan.workers
    assert (worker.rank, worker.local_rank) == (3, 1)
    assert worker.env["GROUP_RANK"] == "1" and worker.env["GLOO_SOCKET_IFNAME"] == "hsn0"
    # No agent in per-task mode, so no agent store; the run id makes frameworks take torchrun's variables.
    assert "TORCHELASTIC_USE_AGENT_STORE" not in worker.env and worker.env["TORCHELASTIC_RUN_ID"] == plan.run_id


def test_under_torchrun_nothing_changes() -> None:
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "abc"}
    plan = make_plan(detect(env), Options(command=PY), facts(env=env))
    assert (plan.scheduler, plan.mode, plan.iface, dict(plan.common_env)) == ("torchrun", "unchanged", None, {})
    assert dict(plan.workers[0].env) == {}


def test_nested_launch_is_refused_with_the_arithmetic() -> None:
    env = {"RANK": "0", "WORLD_SIZE": "8", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "198.18.0.1", "MASTER_PORT": "1"}
    with pytest.raises(HpctorchError) as error:
        make_plan(detect(env), Options(nproc_per_node=4, command=PY), facts(env=env))
    assert "4 x 4 = 16 processes" in error.value.cause


def test_user_interface_variables_are_kept_unless_iface_is_given() -> None:
    user = {"NCCL_SOCKET_IFNAME": "ib0", "OMP_NUM_THREADS": "3"}
    plan = make_plan(local(), Options(nnodes=2, node_rank=0, master_port=1, command=PY), facts(env=user))
    assert "NCCL_SOCKET_IFNAME" not in plan.common_env and "OMP_NUM_THREADS" not in plan.common_env
    assert plan.common_env["GLOO_SOCKET_IFNAME"] == "hsn0"
    forced = make_plan(local(), Options(nnodes=2, node_rank=0, master_port=1, iface="hsn0", command=PY), facts(env=user))
    assert forced.common_env["NCCL_SOCKET_IFNAME"] == "=hsn0"


def test_simulated_nodes_are_real_node_plans_on_loopback() -> None:
    plan = make_plan(local(), Options(simulate_nodes=2, nproc_per_node=2, command=PY), facts())
    assert plan.simulated and (plan.nnodes, plan.world_size) == (2, 4)
    assert [(w.node_rank, w.local_rank, w.rank) for w in plan.workers] == [(0, 0, 0), (0, 1, 1), (1, 0, 2), (1, 1, 3)]
    assert [p.node_rank for p in plan.node_plans] == [0, 1]
    for node_plan in plan.node_plans:
        assert (node_plan.master_addr, node_plan.master_port, node_plan.iface) == ("127.0.0.1", 45678, "lo")
        assert node_plan.rdzv_backend == "static" and node_plan.run_id == plan.run_id
        assert node_plan.common_env["OMP_NUM_THREADS"] == "2"  # 8 CPUs / 2 nodes / 2 workers


def test_simulation_inside_a_multi_node_job_is_refused() -> None:
    env = {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "x", "MASTER_PORT": "1"}
    with pytest.raises(HpctorchError, match="--simulate-nodes"):
        make_plan(detect(env), Options(simulate_nodes=2, command=PY), facts(env=env))


def test_master_hostname_on_the_wrong_network_is_caught() -> None:
    allocation = Allocation(launcher=slurm.LAUNCHER, nodes=("node1", "node2"), tasks_per_node=(1, 1), job_id="7", node_rank=1)
    trap = facts(resolved={"node1": ("198.19.0.1",)})  # management address
    with pytest.raises(HpctorchError) as error:
        make_plan(allocation, Options(command=PY), trap)
    assert "node1 resolves to 198.19.0.1" in error.value.cause and "hsn0" in error.value.fix
    good = make_plan(allocation, Options(command=PY), facts(resolved={"node1": ("198.19.0.1", "198.18.0.1")}))
    assert (good.master_addr, good.node_rank, good.nodes) == ("198.18.0.1", 1, ("node1", "node2"))
    assert good.master_port == 20056  # 20000 + 7 * 8, derived from the job id


def test_plan_round_trips_through_json() -> None:
    plan = make_plan(local(), Options(simulate_nodes=2, nproc_per_node=2, command=PY), facts())
    again = Plan.from_dict(json.loads(plan.to_json()))
    assert again == plan


def test_table_shows_every_decision_with_its_reason() -> None:
    text = table(make_plan(local(), Options(nnodes=2, node_rank=0, master_port=29400, command=PY), facts()))
    for expected in ("per-node", "198.18.0.2", "29400", "hsn0", "fast fabric", "world size 2", "python -u train.py"):
        assert expected in text


def test_nodes_started_by_hand_agree_on_the_run_id() -> None:
    # torch's static rendezvous keys its store by run id: different ids never meet.
    ids = {
        make_plan(local(f"host{rank}"), Options(nnodes=2, node_rank=rank, master_addr="198.18.0.1", master_port=29400, command=PY), facts(pid=100 + rank)).run_id
        for rank in (0, 1)
    }
    assert ids == {"local-29400"}


def test_standalone_is_this_machine_alone_as_with_torchrun() -> None:
    from hpctorch.plan.discover import plan_here

    batch = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_NNODES": "2"}
    assert plan_here(Options(command=PY), batch, exchange=False).mode == "relaunch"
    plan = plan_here(Options(standalone=True, command=PY), batch, exchange=False)
    assert (plan.scheduler, plan.mode, plan.nnodes, plan.master_addr, plan.master_port) == ("local", "per-node", 1, "127.0.0.1", 0)


def test_an_allocation_whose_nodes_are_unnamed_is_not_planned_before_the_allgather() -> None:
    allocation = detect({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"})
    with pytest.raises(HpctorchError, match="allgather must run first"):
        make_plan(allocation, Options(command=PY), facts())


def test_restarts_go_through_torchs_c10d_rendezvous_and_static_ones_are_refused() -> None:
    across = make_plan(local(), Options(nnodes=2, node_rank=0, master_port=1, max_restarts=2, command=PY), facts())
    assert across.rdzv_backend == "c10d" and "every node restarts" in across.reasons["rdzv_backend"]
    assert (across.master_port, across.max_restarts) == (1, 2)
    one = make_plan(local(), Options(master_port=29400, max_restarts=2, command=PY), facts())
    assert one.rdzv_backend == "c10d" and "fresh store" in one.reasons["rdzv_backend"]
    assert make_plan(local(), Options(master_port=29400, command=PY), facts()).rdzv_backend == "static"  # no restarts: as before
    for nnodes in (1, 2):
        with pytest.raises(HpctorchError, match="--max-restarts 2 with --rdzv-backend static"):
            make_plan(local(), Options(nnodes=nnodes, node_rank=0, master_port=1, max_restarts=2, rdzv_backend="static", command=PY), facts())


def test_windows_gets_a_tcpstore_without_libuv_unless_the_user_chose() -> None:
    plan = make_plan(local(), Options(command=PY), facts(platform="win32"))
    assert plan.common_env["USE_LIBUV"] == "0" and "libuv" in plan.reasons["USE_LIBUV"]
    assert "USE_LIBUV" not in make_plan(local(), Options(command=PY), facts()).common_env
    kept = make_plan(local(), Options(command=PY), facts(platform="win32", env={"USE_LIBUV": "1"}))
    assert "USE_LIBUV" not in kept.common_env  # the user's own variable reaches the workers as it is


def test_several_nodes_are_started_by_hpctorch_unless_torchs_agent_is_needed() -> None:
    import sys

    python = (sys.executable, "-u", "train.py")

    def plan(node: int, **extra: object) -> Plan:
        options = Options(nnodes=2, node_rank=node, nproc_per_node=2, master_addr="198.18.0.1", master_port=29400, **extra)  # type: ignore[arg-type]
        return make_plan(local(), options, facts())

    nodes = [plan(n, command=python) for n in (0, 1)]
    assert [p.starter for p in nodes] == ["hpctorch", "hpctorch"]
    # The watchdog's store: the same port on every node, never the workers' (the master port).
    assert nodes[0].watch_port == nodes[1].watch_port and nodes[0].watch_port not in (0, 29400)
    assert "watchdog" in nodes[0].reasons["starter"]
    restarted = plan(0, command=python, max_restarts=1)
    assert (restarted.starter, restarted.watch_port) == ("torch", 0) and "--max-restarts 1" in restarted.reasons["starter"]
    # --stall-timeout: hpctorch's own starter watches the output (the watchdog's helper on several
    # nodes, guard.stallalone on one): torch's agent is not needed for it.
    assert plan(0, command=python, torch_agent_for=("--stall-timeout",)).starter == "hpctorch"
    one = make_plan(local(), Options(nproc_per_node=2, command=python, torch_agent_for=("--stall-timeout",)), facts())
    assert one.mode == "per-node" and one.starter == "hpctorch"
    # The agreement runs inside Python workers: another command keeps torch's agent.
    other = plan(0, command=("./train.sh",))
    assert other.starter == "torch" and "not Python" in other.reasons["starter"]


def test_the_watchdog_port_differs_by_run_and_master_port() -> None:
    from hpctorch.plan import ports

    assert ports.watch_port("slurm-42", 29400) == ports.watch_port("slurm-42", 29400)
    assert len({ports.watch_port("slurm-42", p) for p in range(29400, 29420)}) > 15
    assert all(ports.watch_port(f"job-{n}", 29400) != 29400 for n in range(2000))

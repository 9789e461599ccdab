"""Slurm detection from environments captured on the real Slurm of tests/cluster."""

from __future__ import annotations

import pytest

from hpctorch import Options, make_plan
from hpctorch.errors import HpctorchError
from hpctorch.schedulers import detect, hostlist
from hpctorch.schedulers.allocation import Launched
from hpctorch.schedulers.slurm import parse_tasks_per_node

from .fixtures import load_env
from .helpers import facts

PY = ("python", "-u", "train.py")
ON_FABRIC = {"node1": ("198.18.0.1",)}


@pytest.mark.parametrize("raw, counts", [("2(x3),1", (2, 2, 2, 1)), ("4", (4,)), ("1(x2)", (1, 1)), ("2,1", (2, 1))])
def test_tasks_per_node_syntax(raw: str, counts: tuple[int, ...]) -> None:
    assert parse_tasks_per_node(raw) == counts


def test_per_task_step_two_by_two() -> None:
    a = detect(load_env("slurm/srun_2x2_rank3.env"))
    assert (a.scheduler, a.job_id, a.step_id) == ("slurm", "2", "0")
    assert (a.nodes, a.tasks_per_node) == (("node1", "node2"), (2, 2))
    assert (a.task_rank, a.node_rank, a.local_task_rank, a.launched) == (3, 1, 1, Launched.RANKS)
    assert a.sources["tasks_per_node"] == "SLURM_STEP_TASKS_PER_NODE" and a.sources["nodes"] == "SLURM_STEP_NODELIST"
    plan = make_plan(a, Options(command=PY), facts(resolved=ON_FABRIC))
    assert (plan.mode, plan.world_size, plan.node_rank, plan.master_addr, plan.iface) == ("per-task", 4, 1, "198.18.0.1", "hsn0")
    env = plan.workers[0].env
    assert (env["RANK"], env["LOCAL_RANK"], env["GROUP_RANK"], env["LOCAL_WORLD_SIZE"]) == ("3", "1", "1", "2")
    assert env["HPCTORCH_NODELIST"] == "node[1-2]" and env["HPCTORCH_JOB_ID"] == "2"


def test_one_task_per_node_step_is_per_node_mode() -> None:
    a = detect(load_env("slurm/srun_2x1_rank1.env"))
    assert (a.tasks_per_node, a.node_rank, a.launched) == ((1, 1), 1, Launched.NODES)
    plan = make_plan(a, Options(nproc_per_node=2, command=PY), facts(resolved=ON_FABRIC))
    assert (plan.mode, plan.nnodes, plan.node_rank, plan.world_size) == ("per-node", 2, 1, 4)
    assert [w.rank for w in plan.workers] == [2, 3]
    assert plan.master_port == 20000 + (int(a.job_id) * 8) % 10000  # job 4, step 0


def test_heterogeneous_step_gives_every_task_its_global_rank() -> None:
    a = detect(load_env("slurm/srun_2n3_rank2.env"))
    assert (a.tasks_per_node, a.task_rank, a.node_rank, a.local_task_rank) == ((2, 1), 2, 1, 0)
    plan = make_plan(a, Options(command=PY), facts(resolved=ON_FABRIC))
    # node2 has one task, but node1 has two: the whole step must be per-task.
    assert plan.mode == "per-task" and plan.world_size == 3
    assert plan.workers[0].env["RANK"] == "2" and plan.workers[0].env["LOCAL_WORLD_SIZE"] == "1"


def test_batch_script_relaunches_itself_under_srun() -> None:
    a = detect(load_env("slurm/sbatch_batch_script.env"))
    assert a.launched is Launched.BATCH
    assert a.relaunch_command() == ("srun", "--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1")
    plan = make_plan(a, Options(command=PY), facts())
    assert plan.mode == "relaunch" and plan.workers == () and plan.master_addr is None


def test_salloc_shell_is_not_a_step() -> None:
    a = detect(load_env("slurm/salloc_shell.env"))
    assert a.launched is Launched.BATCH and a.nodes == ("node1", "node2")


def test_interactive_one_node_step_is_not_mistaken_for_the_job() -> None:
    a = detect(load_env("slurm/salloc_srun_one_node.env"))
    assert (a.nodes, a.tasks_per_node, a.launched) == (("node1",), (1,), Launched.NODES)
    plan = make_plan(a, Options(nproc_per_node=2, command=PY), facts())
    assert (plan.mode, plan.nnodes, plan.world_size) == ("per-node", 1, 2)


def test_step_variables_win_over_job_variables() -> None:
    env = load_env("slurm/salloc_srun_one_node.env")
    assert env["SLURM_NODELIST"] == "node[1-2]" and env["SLURM_STEP_NODELIST"] == "node1"
    assert detect(env).sources["nodes"] == "SLURM_STEP_NODELIST"


@pytest.mark.parametrize(
    "overrides, words",
    [
        ({"SLURM_NTASKS": "5", "SLURM_STEP_NUM_TASKS": "5"}, "does not match"),
        ({"SLURM_NODEID": "2"}, "SLURM_NODEID=2 is out of range"),
        ({"SLURM_STEP_TASKS_PER_NODE": "2(x3)"}, "describes 3 node(s)"),
        ({"SLURM_STEP_TASKS_PER_NODE": "two"}, "not Slurm's"),
        ({"SLURM_STEP_NODELIST": "node[2-1]"}, "runs backwards"),
        ({"SLURM_STEP_NUM_NODES": "3"}, "SLURM_STEP_NUM_NODES=3 but SLURM_STEP_NODELIST=node[1-2] names 2 node(s)"),
    ],
)
def test_contradictions_are_one_clear_error(overrides: dict[str, str], words: str) -> None:
    with pytest.raises(HpctorchError) as error:
        detect(load_env("slurm/srun_2x2_rank3.env", **overrides))
    assert words in str(error.value)


def test_a_node_count_that_contradicts_the_node_list_is_one_clear_error() -> None:
    """Was planned from the list, exit 0: a stale SLURM_NNODES from a nested salloc went unnoticed."""
    with pytest.raises(HpctorchError, match=r"SLURM_JOB_NUM_NODES=4 but SLURM_JOB_NODELIST=node\[1-2\] names 2 node\(s\)"):
        detect(load_env("slurm/sbatch_batch_script.env", SLURM_JOB_NUM_NODES="4"))
    with pytest.raises(HpctorchError, match="SLURM_NNODES=3 but SLURM_STEP_NODELIST"):
        detect(load_env("slurm/srun_2x2_rank3.env", SLURM_STEP_NUM_NODES="", SLURM_NNODES="3"))
    # A one-node step in a two-node allocation: SLURM_NNODES is the step's count, SLURM_NODELIST the job's list.
    assert detect(load_env("slurm/salloc_srun_one_node.env")).nodes == ("node1",)


def test_reserved_step_ports_are_used() -> None:
    a = detect(load_env("slurm/srun_2x2_rank3.env", SLURM_STEP_RESV_PORTS="12000-12003"))
    assert a.master_port == 12000 and a.sources["master_port"] == "SLURM_STEP_RESV_PORTS"


def hook(env: dict[str, str]) -> dict[str, str]:
    """What enroot's conf/hooks/extra/50-slurm-pytorch.sh adds inside an NGC container."""
    first = hostlist.expand(env["SLURM_STEP_NODELIST"])[0]
    return {**env, "MASTER_ADDR": first, "MASTER_PORT": str(int(env["SLURM_JOB_ID"]) % 4536 + 61000),
            "WORLD_SIZE": env["SLURM_NTASKS"], "RANK": env["SLURM_PROCID"], "LOCAL_RANK": env["SLURM_LOCALID"]}


@pytest.mark.parametrize("fixture", ["srun_2x2_rank3.env", "srun_2x1_rank1.env"])
def test_torch_variables_a_hook_copied_from_slurm_are_slurms(fixture: str) -> None:
    env = load_env("slurm/" + fixture)
    plain, hooked = detect(env), detect(hook(env))
    assert (hooked.scheduler, hooked.launched, hooked.task_rank, hooked.node_rank, hooked.tasks_per_node) == (
        "slurm", plain.launched, plain.task_rank, plain.node_rank, plain.tasks_per_node)
    assert hooked.master_port == int(env["SLURM_JOB_ID"]) % 4536 + 61000
    assert "copied from slurm's: planned from slurm" in hooked.sources["torch variables"]
    # The hook's MASTER_ADDR names node 0, whose name resolves off the fabric here: its
    # fabric address is used instead (and said so), not the name.
    plan = make_plan(hooked, Options(command=("x",)), facts(resolved={"node1": ("198.18.0.1",)}))
    assert plan.master_addr == "198.18.0.1" and "by a name not trusted" in plan.reasons["master_addr"]


def test_torch_variables_that_contradict_slurm_stop_in_one_line() -> None:
    env = hook(load_env("slurm/srun_2x2_rank3.env"))
    with pytest.raises(HpctorchError, match=r"RANK=2 contradicts slurm, which says 3 \(SLURM_PROCID\)"):
        detect({**env, "RANK": "2"})
    with pytest.raises(HpctorchError, match="WORLD_SIZE=8 contradicts slurm"):
        detect({**env, "WORLD_SIZE": "8"})


def test_a_master_name_that_is_another_node_of_the_job_is_refused() -> None:
    env = {**hook(load_env("slurm/srun_2x1_rank1.env")), "MASTER_ADDR": "node2"}
    with pytest.raises(HpctorchError, match="is node 1 of the job, but rank 0 runs on node1"):
        make_plan(detect(env), Options(command=("x",)), facts(resolved={"node1": ("198.18.0.1",)}))


def test_an_endpoint_outside_the_job_is_refused() -> None:
    allocation = detect(load_env("slurm/srun_2x1_rank1.env"))
    options = Options(master_addr="login01", master_port=29500, master_flag="--rdzv-endpoint", rdzv_backend="c10d", command=("x",))
    with pytest.raises(HpctorchError, match="--rdzv-endpoint login01 is not one of this job's nodes"):
        make_plan(allocation, options, facts(resolved={"node1": ("198.18.0.1",)}))
    inside = make_plan(allocation, Options(master_addr="node1", master_port=29500, master_flag="--rdzv-endpoint", rdzv_backend="c10d",
                                           command=("x",)), facts(resolved={"node1": ("198.18.0.1",)}))
    assert (inside.master_addr, inside.master_port, inside.rdzv_backend) == ("198.18.0.1", 29500, "c10d")
    assert inside.reasons["master_port"] == "--rdzv-endpoint"


def test_arbitrary_distribution_puts_the_node_of_task_0_first(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # srun -m arbitrary with SLURM_HOSTFILE: task 0 on n2, although the sorted list starts with n1.
    from hpctorch.schedulers import detect

    hosts = tmp_path / "hosts"
    hosts.write_text("n2\nn2\nn1\nn1\n")
    env = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
           "SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "0", "SLURM_NODEID": "1", "SLURM_LOCALID": "0",
           "SLURM_DISTRIBUTION": "arbitrary", "SLURM_HOSTFILE": str(hosts)}
    allocation = detect(env)
    assert allocation.nodes == ("n2", "n1") and allocation.node_rank == 0
    other = detect({**env, "SLURM_PROCID": "2", "SLURM_NODEID": "0"})
    assert other.nodes == ("n2", "n1") and other.node_rank == 1
    assert detect({**env, "SLURM_DISTRIBUTION": "block"}).nodes == ("n1", "n2")


def _batch(**extra: str) -> dict[str, str]:
    return {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NNODES": "2", **extra}


def test_batch_script_relaunches_every_rank_when_slurm_can_start_and_bind_them() -> None:
    from hpctorch import Options, make_plan
    from hpctorch.schedulers import detect

    from .helpers import facts

    # sbatch -N2 --ntasks-per-node=4 --gpus-per-node=4: srun starts all 4 ranks per node, one GPU each.
    env = _batch(SLURM_TASKS_PER_NODE="4(x2)", SLURM_JOB_CPUS_PER_NODE="8(x2)")
    plan = make_plan(detect(env), Options(command=("python", "train.py")), facts(gpus=("0", "1", "2", "3")))
    assert plan.relaunch_per_task
    assert plan.relaunch == ("srun", "--nodes=2", "--ntasks-per-node=4", "--kill-on-bad-exit=1", "--gpus-per-task=1")
    assert "per task: slurm starts all 4 rank(s) per node and binds a GPU to each" in plan.reasons["mode"]
    # Asked for one task per node of one CPU: every rank would not fit; one hpctorch per node.
    small = _batch(SLURM_TASKS_PER_NODE="1(x2)", SLURM_JOB_CPUS_PER_NODE="1(x2)")
    plan = make_plan(detect(small), Options(nproc_per_node=2, command=("python", "train.py")), facts())
    assert not plan.relaunch_per_task and plan.relaunch == ("srun", "--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1")
    assert "1 CPU(s) on a node, too few for 2 tasks" in plan.reasons["mode"]
    # Restarts and --mode per-node keep torch's agent on every node.
    for options in (Options(mode="per-node", command=("x",)), Options(max_restarts=2, command=("x",))):
        assert not make_plan(detect(env), options, facts(gpus=("0", "1", "2", "3"))).relaunch_per_task


def test_relaunched_ranks_do_not_get_nproc_per_node_again() -> None:
    from hpctorch.cli.main import _without_nproc
    from hpctorch.cli.parser import parser as _parser

    argv = ["run", "--nproc-per-node", "4", "--nproc_per_node=4", "--timings", "train.py", "--nproc-per-node", "7"]
    args = _parser("run").parse_args(argv)
    args.argv = argv
    assert _without_nproc(args) == ["run", "--timings", "train.py", "--nproc-per-node", "7"]


def test_a_requeued_job_gets_a_run_id_of_its_own() -> None:
    """Same job and step ids after a requeue: without the restart count its file store, master
    record and agreement folder were the previous run's (a file store's keys read again)."""
    from hpctorch.start.filestore import paths

    first = make_plan(detect(load_env("slurm/srun_2x2_rank3.env")), Options(command=("x",)), facts())
    again = make_plan(detect(load_env("slurm/srun_2x2_rank3.env", SLURM_RESTART_COUNT="1")), Options(command=("x",)), facts())
    assert again.run_id == first.run_id + "-r1"
    assert set(paths("/shared", first.run_id)).isdisjoint(paths("/shared", again.run_id))
    assert again.agreement_dir != first.agreement_dir and again.master_port == first.master_port

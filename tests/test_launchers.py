"""launcher=auto|spawn|torchrun|slurm: env parsing as units, torchrun and submitit through train.py."""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import json
import multiprocessing
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

from config import launcher_env
from config.setup import ROOT, compose
from distributed import collectives, context, environment, strategies
from distributed import launch as launching
from distributed.launch import launch, plan_launch
from errors import ConfigError, Preempted, RankFailed
from preflight import check_and_plan
from tests import train_server
from tests.configs import typed_config
from tests.runs import free_port, run_train, same_weights

TINY = ["debug=fdr"]

TORCHRUN_ENV = {
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_WORLD_SIZE": "2",
    "MASTER_ADDR": "node0",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RUN_ID": "abc",
}
SLURM_ENV = {
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "4",
    "SLURM_NODEID": "1",
    "SLURM_NNODES": "2",
    "SLURM_STEP_ID": "0",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_JOB_ID": "4567123",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
}


def _hosts(nodelist: str) -> list[str]:
    assert nodelist == "gpu[07-08]"
    return ["gpu07", "gpu08"]


def _plan(env: dict[str, str], *overrides: str):
    cfg = typed_config(*overrides)
    return plan_launch(cfg.trainer, strategies.get(cfg.strategy), cfg.launcher, env)


@pytest.mark.parametrize(
    "env, found",
    [
        ({}, "spawn"),
        (TORCHRUN_ENV, "torchrun"),
        ({"RANK": "0"}, "torchrun"),  # half a torchrun env is still torchrun: parsing then says what is missing
        (SLURM_ENV, "slurm"),
        (SLURM_ENV | {"RANK": "0", "WORLD_SIZE": "4"}, "slurm"),  # seed 002's sbatch exports RANK for all tasks
        (SLURM_ENV | TORCHRUN_ENV, "torchrun"),  # srun torchrun: one agent per node, its workers are the ranks
        ({**SLURM_ENV, "SLURM_NTASKS": "1"}, "spawn"),  # srun -n1: one process, devices decide
        ({k: v for k, v in SLURM_ENV.items() if k != "SLURM_STEP_ID"}, "spawn"),  # the batch script, not srun
    ],
)
def test_auto_detects_the_launcher_from_the_environment(env, found):
    assert launcher_env.detect(env) == found


def test_torchrun_env_gives_rank_world_and_nodes():
    r = environment.from_torchrun(TORCHRUN_ENV)
    assert (r.rank, r.local_rank, r.world_size, r.local_world_size, r.num_nodes) == (3, 1, 4, 2, 2)
    assert r.master_addr is None  # torchrun exported MASTER_ADDR/PORT; we leave them alone
    assert launcher_env.run_name("auto", TORCHRUN_ENV, "clock") == "torchrun-abc"


def test_torchrun_without_group_world_size_counts_nodes_from_the_local_world():
    env = {k: v for k, v in TORCHRUN_ENV.items() if k != "GROUP_WORLD_SIZE"} | {"WORLD_SIZE": "6"}
    assert environment.from_torchrun(env).num_nodes == 3


def test_rank_without_world_size_is_a_one_line_error():
    with pytest.raises(ConfigError, match="WORLD_SIZE, LOCAL_WORLD_SIZE not set") as e:
        environment.from_torchrun({"RANK": "0", "LOCAL_RANK": "0"})
    assert "\n" not in str(e.value)


def test_slurm_env_gives_ranks_master_and_port():
    r = environment.from_slurm(SLURM_ENV, _hosts)
    assert (r.rank, r.local_rank, r.world_size, r.local_world_size, r.num_nodes) == (3, 1, 4, 2, 2)
    assert (r.master_addr, r.master_port) == ("gpu07", 21230)  # 10000 + 4567123 % 2000 * 10 + step 0
    assert launcher_env.run_name("auto", SLURM_ENV, "clock") == "slurm-4567123.0"
    assert launcher_env.run_name("spawn", SLURM_ENV, "clock") == "clock"


def test_slurm_local_rank_falls_back_to_seed_002():
    env = {k: v for k, v in SLURM_ENV.items() if k != "SLURM_LOCALID"}
    assert environment.from_slurm(env, _hosts).local_rank == 3 - 2 * (3 // 2)


def test_slurm_local_world_is_the_task_count_of_this_ranks_own_node():
    # srun -n3 over two nodes (UNEVEN_SLURM, below): the second node runs one task, the first two.
    env = UNEVEN_SLURM | {"SLURM_PROCID": "2", "SLURM_NODEID": "1", "SLURM_LOCALID": "0"}
    assert environment.from_slurm(env, lambda nodelist: ["n1", "n2"]).local_world_size == 1


def test_slurm_port_is_a_valid_one_apart_for_each_step_and_the_config_wins():
    """Seed 002's 10000 + last 4 digits + SLURM_ARRAY_TASK_ID passed 65535 for array tasks past
    ~45,000 and gave two concurrent steps of one job the same port."""
    ports = {}
    for job in ("4567123", "99999999", "1"):
        for step in ("0", "1", "2"):
            env = SLURM_ENV | {"SLURM_JOB_ID": job, "SLURM_STEP_ID": step, "SLURM_ARRAY_TASK_ID": "59999"}
            ports[job, step] = environment.from_slurm(env, _hosts).master_port
    assert all(10000 <= port < 32768 for port in ports.values()), ports  # below Linux's ephemeral ports
    assert len({ports["4567123", step] for step in ("0", "1", "2")}) == 3
    plan = _plan(
        SLURM_ENV,
        "strategy=ddp",
        "trainer.devices=2",
        "trainer.num_nodes=2",
        "launcher.master_addr=gpu07",
        "launcher.master_port=12345",
    )
    assert plan.master_port == 12345
    # srun --resv-ports: ports SLURM keeps for this step alone
    for reserved in ("12000-12004", "12000,12003", "12000"):
        assert environment.from_slurm(SLURM_ENV | {"SLURM_STEP_RESV_PORTS": reserved}, _hosts).master_port == 12000


@pytest.mark.parametrize(
    "env, name",
    [
        (TORCHRUN_ENV | {"TORCHELASTIC_RUN_ID": "7c1f0e2a"}, "torchrun-7c1f0e2a"),  # --standalone's uuid
        # srun torchrun with no --rdzv-id: the SLURM step is the one thing every node's agent shares
        (TORCHRUN_ENV | {"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "3"}, "slurm-77.3"),
        ({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}, "clock"),  # one process
    ],
)
def test_torchrun_ranks_name_their_run_dir_by_the_job(env, name):
    assert launcher_env.run_name("auto", env, "clock") == name


@pytest.mark.parametrize(
    "env, expected",
    [
        # torchrun --nproc-per-node=2 --master-port=29500: --rdzv-id stays "none", every such run would
        # share outputs/torchrun-none (refused, or silently continued with trainer.resume=auto)
        (
            TORCHRUN_ENV | {"TORCHELASTIC_RUN_ID": "none"},
            ["TORCHELASTIC_RUN_ID=none", "--standalone", "--rdzv-id=", "hydra.run.dir="],
        ),
        # RANK/WORLD_SIZE exported by hand: nothing shared names the run, each rank would take its clock
        (
            {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"},
            ["WORLD_SIZE=2", "hydra.run.dir="],
        ),
    ],
)
def test_ranks_without_a_shared_run_name_stop_in_one_line(env, expected):
    with pytest.raises(ConfigError) as e:
        launcher_env.run_name("auto", env, "clock")
    assert all(part in str(e.value) for part in expected) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("spec, counts", [("4", [4]), ("2(x3)", [2, 2, 2]), ("2(x2),1", [2, 2, 1])])
def test_slurm_tasks_per_node_expands(spec, counts):
    assert environment.tasks_per_node(spec) == counts


def test_only_rank_zero_writes_hydra_files():
    assert launcher_env.is_rank_zero("auto", {})
    assert not launcher_env.is_rank_zero("auto", TORCHRUN_ENV)
    assert launcher_env.is_rank_zero("auto", TORCHRUN_ENV | {"RANK": "0"})
    assert not launcher_env.is_rank_zero("slurm", SLURM_ENV)


@pytest.mark.parametrize(("rank", "record"), [("0", ".hydra"), ("3", None)])
def test_the_config_gives_hydras_record_dir_to_rank_zero_only(monkeypatch, rank, record):
    """The wiring the torchrun and SLURM runs cannot show: their later ranks would write the same
    files into the same dir."""
    for key, value in (TORCHRUN_ENV | {"RANK": rank}).items():
        monkeypatch.setenv(key, value)
    assert compose(hydra=True).hydra.output_subdir == record


def test_the_first_task_of_a_later_slurm_node_is_not_rank_zero():
    # SLURM_LOCALID is 0 on every node: only the global SLURM_PROCID picks the one writer.
    assert not launcher_env.is_rank_zero("auto", SLURM_ENV | {"SLURM_PROCID": "2", "SLURM_LOCALID": "0"})


def test_plan_takes_the_world_from_torchrun():
    plan = _plan(TORCHRUN_ENV, "strategy=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.num_nodes=2")
    assert (plan.launcher, plan.world_size, plan.env_rank.rank, plan.master_addr) == ("torchrun", 4, 3, None)


@pytest.mark.parametrize(
    "env, overrides, expected",
    [
        (
            TORCHRUN_ENV,
            ["trainer.devices=4"],
            "2 process(es) per node on 2 node(s) but trainer.devices=4 trainer.num_nodes=1",
        ),
        (
            SLURM_ENV,
            ["trainer.devices=2", "launcher.master_addr=gpu07"],
            "slurm started 2 process(es) per node on 2 node(s) but trainer.devices=2 trainer.num_nodes=1",
        ),
        (
            SLURM_ENV | {"SLURM_GPUS_ON_NODE": "4"},
            ["trainer.accelerator=gpu", "trainer.devices=2", "trainer.num_nodes=2", "launcher.master_addr=gpu07"],
            "SLURM gave 4 GPU(s) per node but trainer.devices=2 and 2 task(s) per node",
        ),
        ({}, ["trainer.num_nodes=2", "trainer.accelerator=cpu"], "trainer.num_nodes=2 with launcher=spawn"),
        ({}, ["launcher=slurm"], "launcher=slurm but SLURM_PROCID/SLURM_NTASKS are not set"),
    ],
)
def test_environment_that_disagrees_with_the_config_is_a_one_line_error(env, overrides, expected):
    with pytest.raises(ConfigError) as e:
        _plan(env, "strategy=ddp", *overrides)
    assert expected in str(e.value) and "\n" not in str(e.value)


# srun -n3 over two nodes: 2 tasks on the first, 1 on the second
UNEVEN_SLURM = {
    "SLURM_STEP_ID": "0",
    "SLURM_NTASKS": "3",
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_TASKS_PER_NODE": "2,1",
    "SLURM_STEP_NODELIST": "n[1-2]",
}


@pytest.mark.parametrize(
    "env",
    [
        UNEVEN_SLURM | {"SLURM_PROCID": str(rank), "SLURM_NODEID": str(node), "SLURM_LOCALID": str(local)}
        for rank, node, local in [(0, 0, 0), (1, 0, 1), (2, 1, 0)]
    ]
    + [
        {
            "TORCHELASTIC_RUN_ID": "x",
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "3",
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_WORLD_SIZE": "2",
        }
    ],  # two agents, --nproc-per-node=2 and =1
    ids=["slurm-node0-rank0", "slurm-node0-rank1", "slurm-node1", "torchrun"],
)
def test_uneven_tasks_per_node_stop_every_rank_in_one_line(env):
    """The first node's ranks matched trainer.devices=2 num_nodes=2, counted a world of 4 and
    waited in init_process_group for a fourth rank that never came."""
    with pytest.raises(ConfigError, match=r"^uneven tasks per node: \w+ started 3 process\(es\) on 2 node\(s\)") as e:
        _plan(
            env,
            "strategy=ddp",
            "trainer.accelerator=cpu",
            "trainer.devices=2",
            "trainer.num_nodes=2",
            "launcher.master_addr=n1",
        )
    assert "\n" not in str(e.value)


def test_torchrun_workers_on_one_gpu_are_refused_unless_torchrun_bound_them(monkeypatch):
    """Plain torchrun shows every worker all the node's GPUs: two workers and one GPU put both on
    cuda:0, which NCCL refuses only at init ("Duplicate GPU detected"). Under --virtual-local-rank
    each worker sees its own GPU and has LOCAL_RANK=0; srun --gpus-per-task=1 keeps SLURM_LOCALID."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    gpus = ("strategy=ddp", "trainer.gpus=2")
    worker = {"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "1"}
    with pytest.raises(ConfigError, match="^trainer.gpus=2 asks for 2 GPU"):
        _plan(worker | {"RANK": "1", "LOCAL_RANK": "1"}, *gpus)
    bound = _plan(worker | {"RANK": "1", "LOCAL_RANK": "0"}, *gpus)  # torchrun --virtual-local-rank
    assert bound.context(bound.env_rank.rank, bound.env_rank.local_rank).device == torch.device("cuda", 0)
    slurm = _plan(SLURM_ENV, *gpus, "trainer.num_nodes=2", "launcher.master_addr=gpu07")  # SLURM_LOCALID=1
    assert slurm.context(slurm.env_rank.rank, slurm.env_rank.local_rank).device == torch.device("cuda", 0)


ONE_TASK_SLURM = SLURM_ENV | {
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NTASKS": "1",
    "SLURM_NODEID": "0",
    "SLURM_NNODES": "1",
    "SLURM_TASKS_PER_NODE": "1",
}


@pytest.mark.parametrize(
    "env, expected",
    [
        (
            {
                "TORCHELASTIC_RUN_ID": "x",
                "RANK": "0",
                "LOCAL_RANK": "0",
                "WORLD_SIZE": "4",
                "LOCAL_WORLD_SIZE": "4",
                "GROUP_WORLD_SIZE": "1",
            },
            "strategy=dp runs one process per node but torchrun started 4 per node; "
            "start torchrun with --nproc-per-node=1",
        ),
        (
            {**SLURM_ENV, "SLURM_NNODES": "1", "SLURM_TASKS_PER_NODE": "4", "SLURM_NODEID": "0"},
            "strategy=dp runs one process per node but slurm started 4 per node; start slurm with --ntasks-per-node=1",
        ),
        (ONE_TASK_SLURM | {"SLURM_GPUS_ON_NODE": "2"}, "SLURM gave 2 GPU(s) per node but trainer.devices=4"),
        (ONE_TASK_SLURM | {"SLURM_GPUS_ON_NODE": "4"}, None),  # one task drives the node's 4 GPUs
    ],
)
def test_dp_under_torchrun_or_srun_asks_for_one_process_per_node(monkeypatch, env, expected):
    """The message said "set trainer.devices=4" to a user who had set 4: dp's one process was
    compared as if it were the devices; and srun's one dp task on 4 GPUs was refused as a DDP
    layout."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    overrides = (
        "strategy=dp",
        "trainer.gpus=4",
        "launcher=slurm" if "SLURM_PROCID" in env else "launcher=torchrun",
        "launcher.master_addr=gpu07",
    )
    if expected is None:
        assert _plan(env, *overrides).devices_per_process == 4
        return
    with pytest.raises(ConfigError) as e:
        _plan(env, *overrides)
    assert str(e.value).startswith(expected) and "trainer.devices=4 trainer" not in str(e.value), str(e.value)


@pytest.mark.parametrize("strategy", ["single", "dp", "ddp"])
def test_a_gpu_sweep_job_runs_even_one_process_in_a_child(monkeypatch, strategy):
    """Under -m the Hydra process runs job after job: a GPU job trained in it would leave a CUDA
    context there, on the GPUs later jobs' ranks use. CPU jobs and single runs stay in-process."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("MASTER_ADDR", "")  # launch sets them for ddp; monkeypatch puts them back
    monkeypatch.setenv("MASTER_PORT", "")
    spawned, in_process = [], []

    class Finished:
        processes, error_files = [], []

        def join(self, grace_period: float) -> bool:
            return True

    def start_processes(fn, args, nprocs, join, start_method):
        spawned.append(nprocs)
        return Finished()

    monkeypatch.setattr(launching.mp, "start_processes", start_processes)
    # (accelerator, multirun): (the processes spawned, the devices of the workers run here)
    expected = {
        ("gpu", True): ([1], []),
        ("gpu", False): ([], ["cuda"]),
        ("cpu", True): ([], ["cpu"]),
        ("cpu", False): ([], ["cpu"]),
    }
    for accelerator in ("gpu", "cpu"):
        cfg = typed_config(f"strategy={strategy}", f"trainer.accelerator={accelerator}")
        for multirun in (True, False):
            launch(check_and_plan(cfg, multirun=multirun).launch, lambda ctx: in_process.append(ctx.device.type))
            assert (spawned, in_process) == expected[accelerator, multirun], (accelerator, multirun)
            spawned.clear()
            in_process.clear()


def _torchrun(
    cwd: Path, torchrun_args: list[str], *overrides: str, env: dict[str, str] | None = None
) -> train_server.Started:
    """`torchrun ... train.py` from `cwd`, so Hydra's default run dir lands in cwd/outputs; `env`: added
    to this process's environment. The agent is forked from the train server (it imports torch, and
    nothing of its work depends on its own start); its ranks are the interpreters it starts itself."""
    args = [*torchrun_args, str(ROOT / "train.py"), "strategy=ddp", *TINY, *overrides]
    # One thread per rank as spawn's 2 ranks use here (torchrun sets it only for nproc_per_node > 1):
    # another thread count sums in another order, and the weights would differ in the last bits.
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    output = cwd.parent / f"{cwd.name}-torchrun-{uuid.uuid4().hex}.out"
    return train_server.start(args, output, cwd=cwd, module="torch.distributed.run", env=env)


def _finish(agent: train_server.Started) -> tuple[int, str]:
    """The agent's exit code and the end of its output (its ranks' too: they write to the agent's)."""
    try:
        code = agent.wait(timeout=240)
    finally:
        if agent.poll() is None:
            agent.kill()
    return code, agent.output.read_text()[-3000:]


def _one_run_dir(cwd: Path) -> Path:
    runs = list((cwd / "outputs").iterdir())
    assert len(runs) == 1, runs  # a rank that named its own dir would show up here
    return runs[0]


def _assert_rank_zero_wrote(run_dir: Path, world_size: int) -> None:
    assert sorted(p.name for p in (run_dir / ".hydra").iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    log = (run_dir / "train.log").read_text()
    assert log.count("epoch 1/1") == 1 and "[rank " not in log
    assert json.loads((run_dir / "metrics.json").read_text())["world_size"] == world_size


SRUN_TASK = {"SLURM_STEP_ID": "0", "SLURM_NTASKS": "2"}  # a rank that srun started as a task of its own


@pytest.mark.parametrize(
    "env, threads",
    [
        ({}, 4),  # spawned ranks share the launching process's 8 CPUs
        ({"SLURM_CPUS_PER_TASK": "8"}, 4),  # spawned inside `sbatch --cpus-per-task=8`: the same
        (SRUN_TASK | {"SLURM_CPUS_PER_TASK": "2"}, 2),  # srun -c2: each rank a task of its own CPUs
        # sbatch -c16 then srun without -c (SLURM 22.05+): the variable says 16, the task is bound to 8
        (SRUN_TASK | {"SLURM_CPUS_PER_TASK": "16"}, 8),
        (SRUN_TASK | {"SLURM_CPUS_ON_NODE": "8"}, 4),  # srun without -c, tasks not bound: a share of the node's
        (SRUN_TASK | {"SLURM_CPUS_ON_NODE": "64"}, 8),  # bound: its own CPUs
        # `srun -c8 torchrun --nproc-per-node=2`: one task per node, its CPUs shared by the node's 2 ranks
        (SRUN_TASK | {"SLURM_CPUS_PER_TASK": "8", "TORCHELASTIC_RUN_ID": "j"}, 4),
    ],
)
@pytest.mark.parametrize("accelerator", ["cpu", "gpu"])  # a GPU rank's host work: loaders, cpu_offload's step
def test_a_rank_takes_its_own_cpus_as_threads(monkeypatch, env, threads, accelerator):
    monkeypatch.delenv("OMP_NUM_THREADS")  # the suite's own; a user's would win
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(context.os, "sched_getaffinity", lambda pid: set(range(8)))  # the CPUs it is bound to
    for var in ("SLURM_NTASKS", "SLURM_STEP_ID", "SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(7)  # what no case asks for: the rank must set its own
        context.init(context.make_context(0, 0, 2, 2, accelerator, use_process_group=False), timeout_s=10)
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)


def test_a_rank_freezes_what_it_imported_so_leaving_the_group_walks_only_what_it_made_since(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    ctx = context.make_context(0, 0, 1, 1, "cpu", use_process_group=True)
    imports, import_optimizer_step = [], context.import_optimizer_step
    monkeypatch.setattr(context, "import_optimizer_step", lambda: imports.append(import_optimizer_step()))
    gc.unfreeze()  # whatever this test process froze before
    try:
        context.init(ctx, timeout_s=10)
        # The imports, dynamo's too (with the collector paused, in a spawned rank's first import of
        # it), frozen: more objects than the collection still walks.
        assert imports == [None] and context.OPTIMIZER_IMPORT in sys.modules
        assert gc.get_freeze_count() > len(gc.get_objects())
    finally:
        context.shutdown(ctx, clean=True)
        gc.unfreeze()


# The teardown abort made certain, in one process with two gloo ranks: allreduces still in flight as
# the script ends, the last of them on a tensor whose Python object has state of its own (as a
# Parameter's or a DTensor's), so the worker that drops it asks for the GIL; the last exit handler
# holds the GIL in C code meanwhile, and finalization, writing stdout's buffer, lets it go. Ended by
# the interpreter: "terminate called without an active exception", SIGABRT.
TEARDOWN_RACE = """
import atexit, sys
atexit.register(sum, range(2 * 10**7))  # before any import registers its own: it runs last
import threading
from datetime import timedelta
import torch
import torch.distributed as dist
from distributed.launch import end_process

store, groups = dist.HashStore(), [None, None]
def join(rank):
    groups[rank] = dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=30))
threads = [threading.Thread(target=join, args=(rank,)) for rank in (0, 1)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
for group in groups:
    group.allreduce([torch.zeros(5 * 10**6)])
for group in groups:
    small = torch.ones(4)
    small.note = "state of its own"
    group.allreduce([small])
del small
print("done")
end_process(0)
"""


@pytest.mark.slow
def test_a_process_that_leaves_through_end_process_is_not_aborted_by_a_gloo_thread():
    done = subprocess.run([sys.executable, "-c", TEARDOWN_RACE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, "done\n"), done.stderr[-3000:]


def test_train_py_and_the_first_steps_import_run_without_a_full_collection_and_stay_frozen():
    """As every rank imports them: train.py (spawned ranks as __mp_main__), then torch._dynamo, which
    an optimizer's first step imports and the pre-flight's forward imports first. What the imports
    make is walked by no full collection, while they run or after."""
    code = (
        'import gc, runpy, sys; runpy.run_path("train.py", run_name="__mp_main__"); '
        "from config.setup import load; from preflight import check_and_plan; check_and_plan(load()); "
        'print(gc.get_stats()[2]["collections"], gc.isenabled(), "torch._dynamo" in sys.modules, '
        "gc.get_freeze_count() > 10 * len(gc.get_objects()))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "True", "True", "True"]


@pytest.mark.parametrize(
    "strategy, rehearsal", [("fsdp", "trainer.devices=2"), ("dp", "trainer.devices=2 strategy=ddp")]
)
def test_too_few_gpus_names_a_cpu_rehearsal_of_the_same_strategy(strategy, rehearsal):
    with pytest.raises(ConfigError) as error:
        check_and_plan(typed_config("trainer.gpus=2", f"strategy={strategy}"))
    assert str(error.value).endswith(
        f"rehearse on CPU with trainer.accelerator=cpu {rehearsal} in place of trainer.gpus"
    )


def _abort(ctx) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file
    faulthandler.disable()  # pytest's, inherited: it would print the abort as a crash
    os.abort()  # as NCCL's watchdog ends a rank whose collective outlived the timeout


@pytest.mark.parametrize("accelerator", ["gpu", "cpu"])
def test_a_rank_aborted_under_nccl_is_named_as_the_one_that_waited(accelerator):
    plan = launching.LaunchPlan("spawn", accelerator, 2, 2, 1, True, None, None, start_method="fork")
    with pytest.raises(RankFailed) as error:
        launch(plan, _abort)
    assert "killed by SIGABRT" in str(error.value)
    assert ("look for a peer that hung or died first" in str(error.value)) == (accelerator == "gpu")


def _raise_on_rank_1(ctx) -> None:
    if ctx.rank == 1:
        raise KeyError("val/nope")  # as a callback of one's own might, deep in the loop


def test_a_rank_that_raised_is_named_in_one_line_and_its_traceback_kept(monkeypatch):
    # The line says what; where in the rank's code it raised only its traceback says, which a spawned
    # rank writes to a file: train.py logs it, to the console and train.log, before the line.
    plan = launching.LaunchPlan("spawn", "cpu", 2, 2, 1, False, None, None, start_method="fork")
    start, started = launching.mp.start_processes, []

    def recorded(*args, **kwargs):
        started.append(start(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(launching.mp, "start_processes", recorded)
    with pytest.raises(RankFailed) as error:
        launch(plan, _raise_on_rank_1)
    assert str(error.value) == "rank 1 failed: KeyError: 'val/nope'; the other ranks were stopped"
    assert error.value.traceback.startswith("Traceback") and "in _raise_on_rank_1" in error.value.traceback
    assert not [path for path in started[0].error_files if os.path.exists(path)]  # read, then gone from the temp dir


def _ready(ready: Path, rank: int, note_sigterm: bool) -> list[int]:
    """Note SIGTERM as a rank's preemption watch does (or, starting, have none yet), then say so in `ready`."""
    noted: list[int] = []
    handler = (lambda signum, frame: noted.append(signum)) if note_sigterm else signal.SIG_DFL  # not the test's
    signal.signal(signal.SIGTERM, handler)
    (ready / f".{rank}").write_text(str(os.getpid()))
    (ready / f".{rank}").rename(ready / str(rank))  # whole as it appears
    return noted


def _until(done, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def _state(pid: int) -> str:
    """The process's state letter: R, S, T (stopped), Z (ended, not yet reaped), ..."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _save_fails_as_the_job_stops(ctx, ready: Path) -> None:
    noted = _ready(ready, ctx.rank, note_sigterm=True)
    _until(lambda: noted)  # the launcher's copy of the preemption's SIGTERM
    if ctx.rank == 0:
        raise OSError(28, "No space left on device")  # writing last.pt
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # its watch closed: the handler it found is back
    time.sleep(60)  # slow to leave (a logger's upload at exit): torch's own SIGTERM ends it


def _killed_as_it_starts_and_its_peer_echoes(ctx, ready: Path) -> None:
    noted = _ready(ready, ctx.rank, note_sigterm=ctx.rank == 1)
    if ctx.rank == 0:
        time.sleep(60)  # no watch yet: the forwarded SIGTERM ends it
    _until(lambda: noted)
    peer = int((ready / "0").read_text())
    _until(lambda: not Path(f"/proc/{peer}").exists() or _state(peer) == "Z")
    raise RuntimeError("Connection closed by peer")  # its collective with the rank that died


def _notes_the_forwarded_sigterm(ctx, ready: Path) -> None:
    noted = _ready(ready, ctx.rank, note_sigterm=True)
    _until(lambda: noted, timeout_s=10)


def _launch_sent_sigterm(monkeypatch, tmp_path: Path, worker, to_a_thread: bool = False) -> None:
    """Launch 2 ranks of `worker`; once both are ready, SIGTERM to this launcher, as a preemption's;
    `to_a_thread`: to the sender's thread alone, as the kernel may hand it to any thread."""
    monkeypatch.setattr(launching, "_GRACE_S", 0.5)
    plan = launching.LaunchPlan(
        "spawn", "cpu", 2, 2, 1, False, None, None, forward_signals=(signal.SIGTERM,), start_method="fork"
    )

    def unforwarded(signum: int, frame: object) -> None:
        """This process's SIGTERM handler until the launcher's: a signal sent too early is not fatal."""

    def sigterm_once_forwarded() -> None:
        ranks_ready = [tmp_path / "0", tmp_path / "1"]
        _until(lambda: signal.getsignal(signal.SIGTERM) is not unforwarded and all(map(Path.exists, ranks_ready)))
        if to_a_thread:
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
        else:
            os.kill(os.getpid(), signal.SIGTERM)

    before = signal.signal(signal.SIGTERM, unforwarded)
    sender = threading.Thread(target=sigterm_once_forwarded, daemon=True)
    sender.start()
    try:
        launch(plan, worker, tmp_path)
    finally:
        sender.join(timeout=30)
        signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)


def test_a_rank_that_fails_as_a_preempted_job_stops_is_the_error_not_its_peer_that_torch_stopped(monkeypatch, tmp_path):
    """SIGTERM forwarded, rank 0's save of last.pt failed; its peer, whose watch had given SIGTERM
    back, was still leaving when torch stopped it with SIGTERM after the grace period. The job said
    "preempted by SIGTERM before the ranks saved last.pt", exit 143, and hid the full disk."""
    with pytest.raises(RankFailed) as error:
        _launch_sent_sigterm(monkeypatch, tmp_path, _save_fails_as_the_job_stops)
    assert (
        str(error.value) == "rank 0 failed: OSError: [Errno 28] No space left on device; the other ranks were stopped"
    )


def test_a_rank_killed_by_the_forwarded_signal_makes_its_peers_error_an_echo(monkeypatch, tmp_path):
    with pytest.raises(Preempted) as interrupted:
        _launch_sent_sigterm(monkeypatch, tmp_path, _killed_as_it_starts_and_its_peer_echoes)
    assert (interrupted.value.signum, interrupted.value.saved) == (signal.SIGTERM, False)


def test_a_signal_that_another_thread_of_the_launcher_takes_reaches_its_ranks(monkeypatch, tmp_path):
    """The kernel hands a signal sent to the launcher to any of its threads (its TCPStore server's
    too), and Python runs the handler that passes it on in the main thread only, once that thread's
    wait for the ranks returned: when a rank had ended. A Ctrl-C, which reaches spawned ranks only
    as the launcher's copy, waited for the end of training. The pipe it now wakes on is given back:
    left set, its closed descriptor, or whatever file reuses the number, would take a byte a signal."""
    _launch_sent_sigterm(monkeypatch, tmp_path, _notes_the_forwarded_sigterm, to_a_thread=True)
    assert signal.set_wakeup_fd(-1) == -1


def _stays_until_told(ctx, ready: Path) -> None:
    # Says each SIGCONT it takes: a rank stopped by SIGSTOP has no other way to tell it went on.
    signal.signal(signal.SIGCONT, lambda signum, frame: (ready / f"continued-{ctx.rank}").touch())
    _ready(ready, ctx.rank, note_sigterm=False)
    _until(lambda: (ready / "end").exists(), timeout_s=60)


def _launches_two_that_stay(ready: Path, group: Callable[[], Any]) -> None:
    group()
    plan = launching.LaunchPlan("spawn", "cpu", 2, 2, 1, False, None, None, start_method="fork")
    launch(plan, _stays_until_told, ready)


def _catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler for `signum` (its status's SigCgt mask)."""
    caught = re.search(r"SigCgt:\s*(\w+)", Path(f"/proc/{pid}/status").read_text())[1]
    return bool(int(caught, 16) >> (signum - 1) & 1)


@contextlib.contextmanager
def _two_ranks_staying(ready: Path, group: Callable[[], Any]) -> Iterator[tuple[int, list[int]]]:
    """A launcher, forked into `group`, and its two ranks, each waiting until `ready`/end appears;
    (the launcher's pid, its ranks'), once it takes Ctrl-Z. The launcher must then end well."""
    launcher = multiprocessing.get_context("fork").Process(target=_launches_two_that_stay, args=(ready, group))
    launcher.start()
    try:
        _until(lambda: (ready / "0").exists() and (ready / "1").exists() and _catches(launcher.pid, signal.SIGTSTP))
        yield launcher.pid, [int((ready / str(rank)).read_text()) for rank in (0, 1)]
        (ready / "end").touch()
        launcher.join(timeout=30)
        assert launcher.exitcode == 0
    finally:
        launcher.kill()  # and with it its ranks: forked, they take SIGINT when it dies


def test_ctrl_z_stops_the_ranks_with_their_launcher_and_fg_resumes_them(tmp_path):
    """Spawned ranks run in process groups of their own: the terminal's SIGTSTP and the shell's
    SIGCONT reach the launcher alone, which passes them on, as it does Ctrl-C. The launcher runs in a
    group of its own, as a shell's job does: the kernel drops a SIGTSTP to an orphaned one (below)."""
    with _two_ranks_staying(tmp_path, lambda: os.setpgid(0, 0)) as (launcher, ranks):
        job = [launcher, *ranks]
        os.kill(launcher, signal.SIGTSTP)
        _until(lambda: [_state(pid) for pid in job] == ["T"] * 3, timeout_s=10)
        os.kill(launcher, signal.SIGCONT)
        _until(lambda: "T" not in [_state(pid) for pid in job], timeout_s=10)


def test_ctrl_z_that_cannot_stop_the_launcher_leaves_its_ranks_running(tmp_path):
    """A launcher started with setsid (a daemon, a CI job) is an orphaned process group: the kernel
    drops its SIGTSTP, no shell could `fg` it. Its ranks, stopped as it took the signal, go on."""
    with _two_ranks_staying(tmp_path, os.setsid) as (launcher, _):
        os.kill(launcher, signal.SIGTSTP)
        _until(lambda: (tmp_path / "continued-0").exists() and (tmp_path / "continued-1").exists(), timeout_s=10)
        assert _state(launcher) != "T"


def _meet(ctx) -> None:
    context.init(ctx, timeout_s=20)
    try:
        collectives.barrier(ctx)
    finally:
        context.shutdown(ctx, clean=True)


def test_a_neighbour_that_takes_the_port_first_does_not_stop_the_job(monkeypatch):
    """Seconds pass between the launcher's choice of a port and the ranks' start (they import torch
    first): another process on the node may take the port meanwhile. This neighbour tries as the
    ranks start; the job must start all the same."""
    start, neighbours = launching.mp.start_processes, []

    def taken_first(*args, **kwargs):
        neighbour = socket.socket()
        try:
            neighbour.bind(("127.0.0.1", int(os.environ["MASTER_PORT"])))
            neighbour.listen()
            neighbours.append(neighbour)
        except OSError:  # held for the ranks already
            neighbour.close()
        return start(*args, **kwargs)

    monkeypatch.setattr(launching.mp, "start_processes", taken_first)
    plan = launching.LaunchPlan("spawn", "cpu", 2, 2, 1, True, "127.0.0.1", None, start_method="fork")
    try:
        launch(plan, _meet)
    finally:
        for neighbour in neighbours:
            neighbour.close()


def test_a_torchrun_worker_gets_sigterm_when_its_agent_dies(tmp_path):
    """torchrun's agent forwards only --signals-to-handle: SLURM's USR1 or a SIGKILL ends it at once.
    Its workers must not train on as orphans: each gets SIGTERM, a preemption signal (forked here:
    an agent, and its worker that asks for the signal as a torchrun rank does)."""
    ready, got, writing = tmp_path / "ready", tmp_path / "got", tmp_path / "got.tmp"
    agent = os.fork()
    if agent == 0:
        if os.fork() == 0:
            # Written aside and renamed: the test, polling for the file, reads it whole.
            signal.signal(signal.SIGTERM, lambda *_: (writing.write_text("SIGTERM"), writing.rename(got), os._exit(0)))
            launching._end_with_agent()
            ready.touch()
            time.sleep(30)
            os._exit(1)
        time.sleep(60)
        os._exit(0)
    try:
        deadline = time.monotonic() + 10
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        os.kill(agent, signal.SIGKILL)
        os.waitpid(agent, 0)
    deadline = time.monotonic() + 10
    while not got.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert got.exists() and got.read_text() == "SIGTERM"


def test_the_download_group_is_made_only_when_rank_0_has_something_to_fetch(monkeypatch):
    """Its gloo connections between every pair of ranks are, under NCCL, gloo's only use: where a
    wrong GLOO_SOCKET_IFNAME would first fail, for a dataset every node already has."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    ctx = context.make_context(0, 0, 1, 1, "cpu", use_process_group=True)
    made, new_group = [], collectives.dist.new_group
    monkeypatch.setattr(collectives.dist, "new_group", lambda **kw: made.append(kw) or new_group(**kw))
    context.init(ctx, timeout_s=10)
    try:
        fetched = []
        assert (
            collectives.on_main_first(lambda: fetched.append(1), ctx, timedelta(seconds=10), needed=lambda: False)
            is None
        )
        assert (made, fetched) == ([], [])
        assert (
            collectives.on_main_first(lambda: "fetched", ctx, timedelta(seconds=10), needed=lambda: True) == "fetched"
        )
        assert len(made) == 1
    finally:
        context.shutdown(ctx, clean=True)


@pytest.fixture(scope="module")
def restarted_under_torchrun(tmp_path_factory) -> tuple[int, str, Path]:
    """One torchrun agent's 2 ranks of the reference job, run dir chosen by the job, of which rank 1
    is SIGKILLed at its 3rd step and --max-restarts starts the group again: (exit code, stderr, the
    directory train.py ran from). Two tests read it: two ranks under torchrun, and the restart."""
    cwd = tmp_path_factory.mktemp("torchrun")
    killer = ["model._target_=tests.faults.FailingNet", "+model.kill=true", "+model.first_attempt_only=true"]
    agent = ["--standalone", "--nproc_per_node=2", "--max-restarts=1"]
    separate_stores = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}  # environment.from_torchrun says why
    run = _torchrun(cwd, agent, "trainer.devices=2", "trainer.checkpoint_every_n_steps=1", *killer, env=separate_stores)
    return *_finish(run), cwd


@pytest.mark.slow
def test_torchrun_two_processes_train_like_spawn_in_one_run_dir(restarted_under_torchrun, ddp_reference):
    """The two ranks of one torchrun agent (the restart's job: its kill and restart change none of
    this) name one run dir by the job, only rank 0 writes Hydra's files and the log, and they end
    with the weights of spawn's ranks."""
    code, stderr, cwd = restarted_under_torchrun
    assert code == 0, stderr
    run_dir = _one_run_dir(cwd)
    assert run_dir.name.startswith("torchrun-")
    _assert_rank_zero_wrote(run_dir, 2)
    # Ranks from torchrun's env shard the data exactly as spawn's ranks do: the same weights.
    assert same_weights(run_dir, ddp_reference)


@pytest.mark.slow
def test_a_rank_killed_under_torchrun_restarts_resumes_and_ends_as_an_unbroken_run(
    restarted_under_torchrun, ddp_reference
):
    """torchrun --max-restarts starts the worker group again after rank 1's SIGKILL at its 3rd step; the
    new group continues from last.pt unasked, as a SLURM requeue does, to the unbroken run's weights."""
    code, stderr, cwd = restarted_under_torchrun
    assert code == 0, stderr
    run_dir = _one_run_dir(cwd)
    assert re.search(r"from epoch 1 batch [23] \(.*last\.pt\)", (run_dir / "train.log").read_text())
    assert same_weights(run_dir, ddp_reference)


@pytest.mark.slow
def test_two_torchrun_agents_on_this_host_train_over_loopback_like_spawn(tmp_path, ddp_reference, monkeypatch):
    """Multi-node rehearsed as torch's elastic docs do: two agents, one rank each, meeting at a loopback
    --rdzv-endpoint. Every node is this host: no interface variable is needed, and one given is taken."""
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    rendezvous = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}"]
    agents = [
        _torchrun(tmp_path, [*rendezvous, "--rdzv-id=loopback"], "trainer.num_nodes=2", env=env)
        for env in ({}, {"GLOO_SOCKET_IFNAME": "lo"})
    ]
    for agent in agents:
        code, stderr = _finish(agent)
        assert code == 0, stderr
    run_dir = _one_run_dir(tmp_path)
    _assert_rank_zero_wrote(run_dir, 2)
    assert same_weights(run_dir, ddp_reference)


@pytest.mark.slow
def test_torchrun_without_a_run_id_stops_before_any_run_dir(tmp_path):
    """`torchrun --master-port=...` leaves --rdzv-id "none": named by it, every such run would land
    in outputs/torchrun-none. Hydra names the dir before main() runs, so the refusal comes from
    the run_name resolver, in every rank, and no rank makes a dir.

    Started as seed 001 starts train.py, by `python -m torch.distributed.launch`: torchrun's agent,
    which also hands each rank --local-rank=N; a rank that took it for an override would stop at
    Hydra's argument parser instead."""
    launch = [sys.executable, "-m", "torch.distributed.launch", "--nproc_per_node=1", f"--master_port={free_port()}"]
    done = subprocess.run(
        [*launch, str(ROOT / "train.py"), "trainer.epochs=0"], cwd=tmp_path, capture_output=True, text=True, timeout=240
    )
    assert done.returncode != 0 and "error: TORCHELASTIC_RUN_ID=none: torchrun got no --rdzv-id" in done.stderr, (
        done.stderr[-3000:]
    )
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow
def test_submitit_local_sweep_runs_two_jobs(tmp_path):
    sweep = tmp_path / "multirun"
    result = train_server.run(
        ["-m", "hydra/launcher=submitit_local", f"hydra.sweep.dir={sweep}", "trainer.seed=0,1", *TINY]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = [sweep / f"{job}_trainer.seed-{job}" for job in (0, 1)]
    for job, path in enumerate(jobs):
        assert f"trainer.seed={job}" in (path / ".hydra" / "overrides.yaml").read_text()
    losses = [json.loads((path / "metrics.json").read_text())["train_loss"] for path in jobs]
    assert losses[0] != losses[1]  # two jobs, two seeds: really two trainings


def test_without_accounting_squeue_tells_how_a_slurm_job_ended(monkeypatch):
    """sacct fails where SLURM keeps no accounting, and submitit waited forever for a job that ended
    without a result. squeue's answer in its place (the real one: test_slurm.py): a job it lists as
    ended is done, and so is one it lists no more, however it ended (MinJobAge after its end)."""
    from submitit.core import core

    from config.slurm_jobs import FORGOTTEN, SqueueWatcher

    asked = []
    monkeypatch.setattr(
        core.subprocess,
        "check_output",
        lambda command, **kwargs: asked.append(command) or b"7|CANCELLED|rig-a\n8|RUNNING|rig-b\n",
    )
    watcher = SqueueWatcher()
    assert watcher._make_command() is None  # nothing to ask while no job runs
    for job in ("7", "8", "9_0"):
        watcher.register_job(job)
    assert [watcher.is_done(job, mode="force") for job in ("7", "8", "9_0")] == [True, False, True]
    assert [watcher.get_state(job, mode="cache") for job in ("7", "9_0")] == ["CANCELLED", FORGOTTEN]
    assert asked[0][0] == "squeue"


@pytest.mark.parametrize("start_method", ["spawn", "forkserver", "fork"])
def test_the_start_method_and_port_reach_the_ranks(monkeypatch, start_method):
    monkeypatch.setenv("MASTER_ADDR", "")  # launch sets them for ddp; monkeypatch puts them back
    monkeypatch.setenv("MASTER_PORT", "")
    started, port = [], free_port()

    class Finished:
        processes, error_files = [], []

        def join(self, grace_period: float) -> bool:
            return True

    def start_processes(fn, args, nprocs, join, start_method):
        started.append((start_method, args[3]["MASTER_PORT"]))  # the environment each rank starts in
        return Finished()

    monkeypatch.setattr(launching.mp, "start_processes", start_processes)
    monkeypatch.setattr(launching.mp, "set_forkserver_preload", lambda modules: None)  # this process's server
    cfg = typed_config(
        "debug=ddp_cpu", "strategy=ddp", f"launcher.start_method={start_method}", f"launcher.master_port={port}"
    )
    launch(check_and_plan(cfg).launch, print)
    assert started == [(start_method, str(port))]


@pytest.mark.slow
@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_spawned_and_forkserver_ranks_train_exactly_as_forked_ones(run_dir, ddp_reference, start_method):
    # Fork's ranks train in nearly every end-to-end test here (tests/runs.py's FORK_RANKS), the
    # reference's included; spawn is the default.
    result = run_train(run_dir, "debug=ddp_cpu", "strategy=ddp", f"launcher.start_method={start_method}")
    assert result.returncode == 0, result.stderr
    assert same_weights(run_dir, ddp_reference)


def test_fork_cannot_start_gpu_ranks(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    cfg = typed_config("strategy=ddp", "trainer.gpus=2", "launcher.start_method=fork")
    with pytest.raises(ConfigError, match=r"^launcher.start_method=fork cannot start GPU ranks: .*forkserver"):
        check_and_plan(cfg)


# Imports what the forkserver preloads, train.py as the server does (__mp_main__), with every way into
# CUDA recorded: a server that touched CUDA would hand each forked rank a broken CUDA state.
_PRELOAD_TOUCHES_CUDA = """
import runpy, torch
touched = []
def record(name, real):
    def wrapper(*args, **kwargs):
        touched.append(name)
        return real(*args, **kwargs)
    return wrapper
for name in ("_lazy_init", "init", "is_available", "device_count", "current_device"):
    setattr(torch.cuda, name, record(name, getattr(torch.cuda, name)))
torch._C._cuda_getDeviceCount = record("_cuda_getDeviceCount", torch._C._cuda_getDeviceCount)
from distributed.launch import forkserver_preload
from training.run import run
for module in forkserver_preload(run):
    runpy.run_path("train.py", run_name="__mp_main__") if module == "__main__" else __import__(module)
print(touched)
"""


def test_the_forkserver_preload_never_touches_cuda():
    done = subprocess.run(
        [sys.executable, "-c", _PRELOAD_TOUCHES_CUDA], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def _record_master_port(ctx, out: str) -> None:
    Path(out, f"rank{ctx.rank}").write_text(os.environ["MASTER_PORT"])


def test_each_launch_hands_its_forkserver_ranks_its_own_environment(monkeypatch, tmp_path):
    """A forkserver outlives the launch that started it: a sweep's next job must not hand its ranks
    the environment the server started with (an earlier job's MASTER_PORT)."""
    monkeypatch.setenv("MASTER_ADDR", "")  # launch sets them; monkeypatch puts them back
    monkeypatch.setenv("MASTER_PORT", "")
    train_server.ensure_running()  # already running when the launches come, as in a sweep's later jobs
    cfg = typed_config(
        "strategy=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "launcher.start_method=forkserver"
    )
    for job in ("first", "second"):
        (tmp_path / job).mkdir()
        launch(check_and_plan(cfg).launch, _record_master_port, str(tmp_path / job))
        ports = [(tmp_path / job / f"rank{r}").read_text() for r in range(2)]
        assert ports[0] == ports[1] != "", ports  # the launch's store, not the server's empty MASTER_PORT


def test_a_ctrl_c_in_a_rank_run_in_the_launchers_process_is_an_interruption_that_saved_nothing():
    """A single run's rank runs in train.py's process: its KeyboardInterrupt (a second Ctrl-C, or one
    before its watch took SIGINT) is what a spawned rank's death by SIGINT is, not a traceback, and
    not the pre-flight's Ctrl-C, after which train.py puts the run dir's record back."""
    plan = check_and_plan(typed_config("trainer.accelerator=cpu")).launch
    assert plan.in_process

    def ctrl_c(ctx):
        raise KeyboardInterrupt

    try:
        launch(plan, ctrl_c)
    except KeyboardInterrupt:  # caught here, or it would end the whole test session
        pytest.fail("the rank's KeyboardInterrupt left launch() as it was")
    except Preempted as stopped:
        assert (stopped.signum, stopped.saved, stopped.is_main) == (signal.SIGINT, False, True)
    else:
        pytest.fail("launch() returned")

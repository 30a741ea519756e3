"""launcher=auto|spawn|torchrun|slurm: env parsing as units, torchrun and submitit through train.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from config.check import check
from distributed import environment, launch as launching
from distributed.launch import launch, plan_launch
from errors import ConfigError
from distributed import strategies
from tests import train_server
from tests.conftest import ROOT, free_port, run_train, same_weights, typed_config

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
TINY = ["debug=fdr"]

TORCHRUN_ENV = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "2",
                "MASTER_ADDR": "node0", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "abc"}
SLURM_ENV = {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4", "SLURM_NODEID": "1", "SLURM_NNODES": "2",
             "SLURM_STEP_ID": "0", "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_ID": "4567123",
             "SLURM_JOB_NODELIST": "gpu[07-08]"}


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
    assert environment.detect(env) == found


def test_torchrun_env_gives_rank_world_and_nodes():
    r = environment.from_torchrun(TORCHRUN_ENV)
    assert (r.rank, r.local_rank, r.world_size, r.local_world_size, r.num_nodes) == (3, 1, 4, 2, 2)
    assert r.master_addr is None  # torchrun exported MASTER_ADDR/PORT; we leave them alone
    assert environment.run_name("auto", TORCHRUN_ENV, "clock") == "torchrun-abc"


def test_rank_without_world_size_is_a_one_line_error():
    with pytest.raises(ConfigError, match="WORLD_SIZE, LOCAL_WORLD_SIZE not set") as e:
        environment.from_torchrun({"RANK": "0", "LOCAL_RANK": "0"})
    assert "\n" not in str(e.value)


def test_slurm_env_gives_ranks_master_and_port():
    r = environment.from_slurm(SLURM_ENV, _hosts)
    assert (r.rank, r.local_rank, r.world_size, r.local_world_size, r.num_nodes) == (3, 1, 4, 2, 2)
    assert (r.master_addr, r.master_port) == ("gpu07", 10000 + 7123)
    assert environment.run_name("auto", SLURM_ENV, "clock") == "slurm-4567123.0"
    assert environment.run_name("spawn", SLURM_ENV, "clock") == "clock"


def test_slurm_port_counts_the_array_task_and_local_rank_falls_back_to_seed_002():
    env = {k: v for k, v in SLURM_ENV.items() if k != "SLURM_LOCALID"} | {"SLURM_ARRAY_TASK_ID": "5"}
    r = environment.from_slurm(env, _hosts)
    assert r.local_rank == 3 - 2 * (3 // 2)
    assert r.master_port == 10000 + 7123 + 5


@pytest.mark.parametrize("spec, counts", [("4", [4]), ("2(x3)", [2, 2, 2]), ("2(x2),1", [2, 2, 1])])
def test_slurm_tasks_per_node_expands(spec, counts):
    assert environment.tasks_per_node(spec) == counts


def test_only_rank_zero_writes_hydra_files():
    assert environment.is_rank_zero("auto", {})
    assert not environment.is_rank_zero("auto", TORCHRUN_ENV)
    assert environment.is_rank_zero("auto", TORCHRUN_ENV | {"RANK": "0"})
    assert not environment.is_rank_zero("slurm", SLURM_ENV)


def test_plan_takes_the_world_from_torchrun():
    plan = _plan(TORCHRUN_ENV, "strategy=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.num_nodes=2")
    assert (plan.launcher, plan.world_size, plan.env_rank.rank, plan.master_addr) == ("torchrun", 4, 3, None)


@pytest.mark.parametrize(
    "env, overrides, expected",
    [
        (TORCHRUN_ENV, ["trainer.devices=4"], "2 process(es) per node on 2 node(s) but trainer.devices=4 trainer.num_nodes=1"),
        (SLURM_ENV, ["trainer.devices=2", "launcher.master_addr=gpu07"], "slurm started 2 process(es) per node on 2 node(s) but trainer.devices=2 trainer.num_nodes=1"),
        (SLURM_ENV | {"SLURM_GPUS_ON_NODE": "4"},
         ["trainer.accelerator=gpu", "trainer.devices=2", "trainer.num_nodes=2", "launcher.master_addr=gpu07"],
         "SLURM runs 2 task(s) per node but gave 4 GPU(s) per node"),
        ({}, ["trainer.num_nodes=2", "trainer.accelerator=cpu"], "trainer.num_nodes=2 with launcher=spawn"),
        ({}, ["launcher=slurm"], "launcher=slurm but SLURM_PROCID/SLURM_NTASKS are not set"),
    ],
)
def test_environment_that_disagrees_with_the_config_is_a_one_line_error(env, overrides, expected):
    with pytest.raises(ConfigError) as e:
        _plan(env, "strategy=ddp", *overrides)
    assert expected in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("strategy", ["single", "dp", "ddp"])
def test_a_gpu_sweep_job_runs_even_one_process_in_a_child(monkeypatch, strategy):
    """Under -m the Hydra process runs job after job: a GPU job trained in it would leave a CUDA
    context there, on the GPUs later jobs' ranks use. CPU jobs and single runs stay in-process."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("MASTER_ADDR", "")  # launch sets them for ddp; monkeypatch puts them back
    monkeypatch.setenv("MASTER_PORT", "")
    spawned, in_process = [], []

    class Finished:
        processes = []

        def join(self, grace_period: float) -> bool:
            return True

    def start_processes(fn, args, nprocs, join, start_method):
        spawned.append(nprocs)
        return Finished()

    monkeypatch.setattr(launching.mp, "start_processes", start_processes)
    # (accelerator, multirun): (the processes spawned, the devices of the workers run here)
    expected = {("gpu", True): ([1], []), ("gpu", False): ([], ["cuda"]),
                ("cpu", True): ([], ["cpu"]), ("cpu", False): ([], ["cpu"])}
    for (accelerator, multirun), where in expected.items():
        cfg = typed_config(f"strategy={strategy}", f"trainer.accelerator={accelerator}")
        launch(check(cfg, multirun=multirun), lambda ctx: in_process.append(ctx.device.type))
        assert (spawned, in_process) == where, (accelerator, multirun)
        spawned.clear()
        in_process.clear()


def _torchrun(cwd: Path, torchrun_args: list[str], *overrides: str) -> subprocess.Popen:
    """`torchrun ... train.py` from `cwd`, so Hydra's default run dir lands in cwd/outputs."""
    cmd = [*TORCHRUN, *torchrun_args, str(ROOT / "train.py"), "strategy=ddp", *TINY, *overrides]
    # One thread per rank as spawn's 2 ranks use here (torchrun sets it only for nproc_per_node > 1):
    # another thread count sums in another order, and the weights would differ in the last bits.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _finish(process: subprocess.Popen) -> tuple[int, str]:
    try:
        _, stderr = process.communicate(timeout=240)
    finally:
        process.kill()
    return process.returncode, stderr[-3000:]


def _one_run_dir(cwd: Path) -> Path:
    runs = list((cwd / "outputs").iterdir())
    assert len(runs) == 1, runs  # a rank that named its own dir would show up here
    return runs[0]


def _assert_rank_zero_wrote(run_dir: Path, world_size: int) -> None:
    assert sorted(p.name for p in (run_dir / ".hydra").iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    log = (run_dir / "train.log").read_text()
    assert log.count("epoch 1/1") == 1 and "[rank " not in log
    assert json.loads((run_dir / "metrics.json").read_text())["world_size"] == world_size


@pytest.mark.slow
def test_torchrun_two_processes_train_like_spawn_in_one_run_dir(tmp_path, spawn_reference):
    code, stderr = _finish(_torchrun(tmp_path, ["--standalone", "--nproc_per_node=2"], "trainer.devices=2"))
    assert code == 0, stderr
    run_dir = _one_run_dir(tmp_path)
    assert run_dir.name.startswith("torchrun-")
    _assert_rank_zero_wrote(run_dir, 2)
    # Ranks from torchrun's env shard the data exactly as spawn's ranks do: the same weights.
    assert same_weights(run_dir, spawn_reference)


@pytest.mark.slow
def test_two_torchrun_agents_rendezvous_as_two_nodes(tmp_path, spawn_reference):
    rendezvous = ["--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
                  f"--rdzv_endpoint=127.0.0.1:{free_port()}", "--rdzv_id=two-nodes"]
    agents = [_torchrun(tmp_path, rendezvous, "trainer.num_nodes=2") for _ in range(2)]
    for code, stderr in map(_finish, agents):
        assert code == 0, stderr
    run_dir = _one_run_dir(tmp_path)
    assert run_dir.name == "torchrun-two-nodes"
    _assert_rank_zero_wrote(run_dir, 2)
    assert same_weights(run_dir, spawn_reference)


# Each run stops at check() (epochs=0), after Hydra made the run dir in every rank: the naming is
# what is under test, and a run costs ~12 s here. Measured on this 2-core machine under load: with
# the per-process clock (outputs/<date>/<time>) 5 of 10 torchrun runs split in two dirs; named by
# TORCHELASTIC_RUN_ID, 0 of 10.
REPEATS = 3  # the 10-run figures above were taken by hand; 3 keep the suite short


@pytest.mark.slow
def test_torchrun_ranks_never_split_the_run_dir(tmp_path):
    # torchrun stops the other workers when one fails, at its next poll: every 10 s gives the slower
    # rank time to reach check() too (at 4 s one rank was stopped first in 1 of 2 full-suite runs).
    # The runs go at once (a port each), so the 10 s are waited once, and the ranks start under load.
    runs = []
    for i in range(REPEATS):
        (tmp_path / str(i)).mkdir()
        torchrun = ["--nproc_per_node=2", "--monitor-interval=10", f"--master_port={free_port()}"]
        runs.append(_torchrun(tmp_path / str(i), torchrun, "trainer.devices=2", "trainer.epochs=0"))
    for i, run in enumerate(runs):
        code, stderr = _finish(run)
        assert code != 0 and stderr.count("error: trainer.epochs=0") == 2, stderr  # both ranks made a dir
        run_dir = _one_run_dir(tmp_path / str(i))
        assert (run_dir / ".hydra" / "config.yaml").is_file()


@pytest.mark.slow
def test_submitit_local_sweep_runs_two_jobs(tmp_path):
    sweep = tmp_path / "multirun"
    result = train_server.run(["-m", "hydra/launcher=submitit_local", f"hydra.sweep.dir={sweep}", "trainer.seed=0,1", *TINY])
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = [sweep / f"{job}_trainer.seed-{job}" for job in (0, 1)]
    for job, path in enumerate(jobs):
        assert f"trainer.seed={job}" in (path / ".hydra" / "overrides.yaml").read_text()
    losses = [json.loads((path / "metrics.json").read_text())["train_loss"] for path in jobs]
    assert losses[0] != losses[1]  # two jobs, two seeds: really two trainings


@pytest.mark.slow
@pytest.mark.parametrize("start_method", ["forkserver", "fork"])
def test_ranks_forked_train_exactly_as_spawned_ones(run_dir, spawn_reference, start_method):
    result = run_train(run_dir, "debug=ddp_cpu", "strategy=ddp", f"launcher.start_method={start_method}")
    assert result.returncode == 0, result.stderr
    assert same_weights(run_dir, spawn_reference)


def test_fork_cannot_start_gpu_ranks(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    cfg = typed_config("strategy=ddp", "trainer.gpus=2", "launcher.start_method=fork")
    with pytest.raises(ConfigError, match=r"^launcher.start_method=fork cannot start GPU ranks: .*forkserver"):
        check(cfg)


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
    done = subprocess.run([sys.executable, "-c", _PRELOAD_TOUCHES_CUDA], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
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
    cfg = typed_config("strategy=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "launcher.start_method=forkserver")
    for job in ("first", "second"):
        (tmp_path / job).mkdir()
        launch(check(cfg), _record_master_port, str(tmp_path / job))
        assert [(tmp_path / job / f"rank{r}").read_text() for r in range(2)] == [os.environ["MASTER_PORT"]] * 2

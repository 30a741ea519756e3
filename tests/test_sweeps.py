"""`python train.py -m ...` sweeps: a dir per job with metrics and TensorBoard, then bench.report on them."""

from __future__ import annotations

import itertools
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from bench import report
from config import typed as typed_module
from config.schema import StrategyName
from config.setup import compose, job_dir
from config.typed import typed
from errors import ConfigError
from preflight import check_and_plan
from tests import train_server
from tests.runs import FORK_RANKS, wandb_records
from training.loggers.tensorboard import HPARAM_METRICS

TINY = ("debug=limit",)  # 3 short epochs


def _multirun(sweep_dir: Path, *overrides: str) -> list[Path]:
    result = train_server.run(["-m", FORK_RANKS, f"hydra.sweep.dir={sweep_dir}", *TINY, *overrides])
    assert result.returncode == 0, result.stderr
    return sorted(p for p in sweep_dir.iterdir() if (p / ".hydra").is_dir())  # the jobs' (not mlartifacts/)


def _hparams(events: EventAccumulator) -> dict:
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    values = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    return {key: value.string_value or value.number_value for key, value in values.items()}


# (strategy, trainer.devices) of each job a ready-made sweep runs, in order.
SWEEP_JOBS = {
    "scaling": [("ddp", n) for n in (1, 2, 4, 8)],
    "dp_vs_ddp": [(s, n) for s in ("dp", "ddp") for n in (1, 2, 4)],
    "strategies": [("single", 1), *((s, n) for s in ("ddp", "fsdp") for n in (1, 2, 4))],
}


def _sweep_jobs(*overrides: str) -> list[tuple[str, ...]]:
    """The overrides of each job `python train.py -m *overrides` runs, as the basic sweeper makes them."""
    params = compose(*overrides, hydra=True).hydra.sweeper.params
    return list(
        itertools.product(*([f"{key}={value}" for value in str(values).split(",")] for key, values in params.items()))
    )


@pytest.mark.parametrize("sweep", SWEEP_JOBS)
def test_ready_made_sweeps_compose_job_by_job(sweep):
    # On GPUs, as their figures are meant; here (no GPU) the first job stops, naming the rehearsal.
    with pytest.raises(ConfigError, match="trainer.accelerator=cpu"):
        check_and_plan(typed(compose(f"sweep={sweep}", *_sweep_jobs(f"sweep={sweep}")[-1])))
    overrides = [f"sweep={sweep}", "trainer.accelerator=cpu"]
    jobs = _sweep_jobs(*overrides)
    configs = [typed(compose(*overrides, *job)) for job in jobs]
    assert [(cfg.strategy.name.value, cfg.trainer.devices) for cfg in configs] == SWEEP_JOBS[sweep]
    for job, cfg in zip(jobs, configs):
        dp = cfg.strategy.name == StrategyName.dp
        if dp and cfg.trainer.devices > 1:
            with pytest.raises(ConfigError, match="strategy=ddp"):  # DP splits over GPUs, not CPUs
                check_and_plan(cfg)
            continue
        processes = 1 if dp else cfg.trainer.devices  # DP: one process
        assert check_and_plan(cfg).launch.processes_per_node == processes, job


def test_a_job_dir_is_named_by_its_overrides_with_floats_to_4_digits_and_stays_apart_from_its_neighbours():
    cfg = compose("model=simple_cnn", "optimizer.lr=0.03028525153605885", hydra=True)
    naming = cfg.hydra.job.config.override_dirname

    def name(num, *overrides):
        return job_dir(num, overrides, naming.exclude_keys, naming.kv_sep, naming.item_sep)

    assert (
        name(3, "optimizer=sgd", "trainer.progress_bar=false", "model=simple_cnn") == "3_model-simple_cnn+optimizer-sgd"
    )
    assert name(0) == "0"
    # A search's sampled floats to 4 significant digits (the exact value stays in .hydra/); the job's
    # number keeps two that round alike apart. A float as typed stays as typed.
    assert name(0, "optimizer.lr=0.03028525153605885", "trainer.batch_size=64") == (
        "0_optimizer.lr-0.03029+trainer.batch_size-64"
    )
    assert name(1, "optimizer.lr=0.030287") == "1_optimizer.lr-0.03029"
    assert name(2, "optimizer.weight_decay=1.2345678e-05", "optimizer.lr=1e-3", "trainer.label_smoothing=0.1") == (
        "2_optimizer.lr-1e-3+optimizer.weight_decay-1.235e-05+trainer.label_smoothing-0.1"
    )
    # What conf/config.yaml's ${job_dir:} resolves to; outside a sweep (--cfg all --resolve) it says what goes first.
    assert OmegaConf.select(cfg, "hydra.sweep.subdir") == "<job number>_model-simple_cnn+optimizer.lr-0.03029"
    long = [f"model.key{i}=a_value_longer_than_twenty_bytes_{i}" for i in range(8)]  # > 255 bytes
    names = [name(7, *long, f"trainer.seed={seed}") for seed in (1, 2)]
    assert all(len(n.encode()) <= 200 and n.startswith("7_model.key0-a_value") for n in names)
    assert names[0] != names[1]
    # A value's "/" would nest the job's dir in another, or put it outside the sweep's by "../".
    assert name(4, "trainer.checkpoint.monitor=val/loss", "+note=../../x") == (
        "4_+note-.._.._x+trainer.checkpoint.monitor-val_loss"
    )
    # Machine paths tell no job from another.
    assert {"paths.data_dir", "paths.log_dir", "paths.sweep_dir", "paths.root_dir"} <= set(naming.exclude_keys)


def test_the_report_of_sweep_strategies_compares_each_strategy_with_its_own_one_device_run(tmp_path):
    # Jobs as the sweep writes them: overrides.yaml holds parallelism=<job>, metrics.json the rest.
    for i, job in enumerate(_sweep_jobs("sweep=strategies", "trainer.accelerator=cpu")):
        cfg = typed(compose("sweep=strategies", "trainer.accelerator=cpu", *job))
        strategy, devices = cfg.strategy.name.value, cfg.trainer.devices
        run = tmp_path / str(i)
        (run / ".hydra").mkdir(parents=True)
        (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["sweep=strategies", *job]))
        speed = {"single": 100.0, "ddp": 90.0 * devices, "fsdp": 60.0 * devices}[strategy]
        (run / "metrics.json").write_text(
            json.dumps(
                {
                    "strategy": strategy,
                    "devices": devices,
                    "model": "m",
                    "dataset": "d",
                    "batch_size": 64,
                    "train_samples_per_s": speed,
                    "val_acc": 0.9,
                    "best_val_acc": 0.9,
                    "wall_s": 1.0,
                }
            )
        )
    rows = report.rows(report.load_runs(tmp_path))
    speedups = {(row.run.strategy, row.run.devices): row.speedup for row in rows}
    assert speedups == pytest.approx(
        {("single", 1): None, **{(s, n): float(n) for s in ("ddp", "fsdp") for n in (1, 2, 4)}}
    )
    table = report.markdown(rows)
    assert "parallelism" not in table.splitlines()[0]  # the strategy and devices columns say it


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning:mlflow.*")  # MLflow's own use of SQLAlchemy
def test_scaling_sweep_runs_ddp_per_job_logs_each_as_a_run_of_the_sweep_and_reports(memory_dir, monkeypatch):
    from mlflow.tracking import MlflowClient

    for variable in ("WANDB_MODE", "WANDB_API_KEY", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(variable, raising=False)
    sweep = memory_dir / "scaling" / "sweep"
    for variable in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):  # not the user's home
        monkeypatch.setenv(variable, str(sweep.parent / variable))
    # The command line narrows 1,2,4,8
    jobs = _multirun(sweep, "sweep=scaling", "trainer.devices=1,2", "logger=[tensorboard,wandb,mlflow]")
    # Each job's dir, and so its TensorBoard run, is named by the overrides that tell it apart.
    assert [job.name for job in jobs] == [
        f"{i}_logger-[tensorboard,wandb,mlflow]+strategy-ddp+trainer.devices-{i + 1}" for i in range(2)
    ]
    metrics = [json.loads((job / "metrics.json").read_text()) for job in jobs]
    assert [(m["strategy"], m["devices"], m["world_size"], m["batch_size"]) for m in metrics] == [
        ("ddp", 1, 1, 64),
        ("ddp", 2, 2, 64),
    ]
    for job, m in zip(jobs, metrics):
        (events_file,) = (job / "tb").iterdir()  # rank 0 alone writes, hparams included: one file
        events = EventAccumulator(str(job / "tb"), size_guidance={"images": 0})
        events.Reload()
        # Each HParams metric is the last point of a per-epoch series: no one-point final/* charts.
        assert {"train/loss", *HPARAM_METRICS} <= set(events.Tags()["scalars"])
        assert not any(tag.startswith("final/") for tag in events.Tags()["scalars"])
        assert [e.value for e in events.Scalars("val/best_acc")] == sorted(
            e.value for e in events.Scalars("val/best_acc")
        )
        assert events.Scalars("val/best_acc")[-1].value == pytest.approx(m["best_val_acc"])
        hparams = _hparams(events)
        assert (hparams["strategy"], hparams["trainer.devices"], hparams["model"]) == ("ddp", m["devices"], "mnist_net")
        # sweep=scaling's params set strategy=ddp for every job and trainer.devices=1,2,4,8, narrowed here.
        experiment = plugin_data_pb2.HParamsPluginData.FromString(
            events.PluginTagToContent("hparams")["_hparams_/experiment"]
        ).experiment
        assert [info.name for info in experiment.hparam_infos if info.differs] == ["trainer.devices"]
        images = events.Images("val/samples")
        assert len(images) == 3 and images[-1].width > 0  # one grid per epoch
        assert images[-1].encoded_image_string[:4] == b"\x89PNG"

    # W&B and MLflow: a run per job, named by its overrides, grouped by the sweep (its dir's last two parts)
    names = [f"strategy=ddp trainer.devices={n} logger=['tensorboard', 'wandb', 'mlflow']" for n in (1, 2)]
    group = f"{sweep.parent.name}/sweep"
    runs = [
        r.run
        for job in jobs
        for r in wandb_records(next(job.glob("wandb/offline-run-*/run-*.wandb")))
        if r.HasField("run")
    ]
    assert [(run.display_name, run.run_group) for run in runs] == [(name, group) for name in names]
    client = MlflowClient(f"sqlite:///{sweep / 'mlflow.db'}")  # the sweep's one store
    logged = client.search_runs(
        [client.get_experiment_by_name(group).experiment_id], order_by=["attributes.start_time"]
    )
    assert [(run.info.run_name, run.info.status, run.data.tags["sweep"]) for run in logged] == [
        (name, "FINISHED", group) for name in names
    ]
    assert [run.data.metrics["best_val_acc"] for run in logged] == [m["best_val_acc"] for m in metrics]

    # `python -m bench.report`, forked from the train server: the torch it imports is imported there.
    result = train_server.run([str(sweep)], timeout=120, module="bench.report")
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ddp |")]
    speedup = metrics[1]["train_samples_per_s"] / metrics[0]["train_samples_per_s"]
    assert len(rows) == 2 and "| 1.00× | 100% |" in rows[0] and f"| {speedup:.2f}× |" in rows[1]
    assert (sweep / "report.png").stat().st_size > 0


@pytest.mark.slow
def test_every_strategy_runs_under_multirun(tmp_path):
    # sweep=strategies' 1-device jobs (the command line narrows its seven): one process runs all three
    # (world size 1), each joining and leaving its own process group. A note's "/" stays in the job's one dir.
    jobs = _multirun(tmp_path / "sweep", "sweep=strategies", "parallelism=single,ddp1,fsdp1", "+note=cpu/1")
    assert [job.name for job in jobs] == [
        f"{i}_+note-cpu_1+parallelism-{p}" for i, p in enumerate(("single", "ddp1", "fsdp1"))
    ]
    metrics = [json.loads((job / "metrics.json").read_text()) for job in jobs]
    assert [(m["strategy"], m["devices"]) for m in metrics] == [("single", 1), ("ddp", 1), ("fsdp", 1)]
    assert all((job / "checkpoints" / "last.pt").exists() and (job / "train.log").is_file() for job in jobs)


# hydra.mode=MULTIRUN on the command line starts a sweep as -m does (train.py reads the mode there:
# config.setup.mode_from_the_command_line).
@pytest.mark.parametrize("multirun", ["-m", "hydra.mode=MULTIRUN"])
def test_a_value_no_job_could_use_refuses_the_sweep_before_its_first_job_trains(tmp_path, multirun):
    # The jobs listed before the bad one trained first (a GPU's hours), then the sweep stopped there.
    sweep = tmp_path / "sweep"
    result = train_server.run([multirun, f"hydra.sweep.dir={sweep}", *TINY, "trainer.max_steps=2,-1"])
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "error: trainer.max_steps=-1: use 1 or more optimizer steps, or null for no limit but trainer.epochs "
        "(the sweep's job trainer.max_steps=-1: fix it, and run the sweep again)"
    )
    assert not list(sweep.glob("*/checkpoints")) and not list(sweep.glob("*/train.log"))


def test_a_sweep_run_again_in_its_dir_names_the_sweeps_dir_and_how_to_continue(tmp_path):
    # It named the job's dir as hydra.run.dir, a key no -m run reads.
    sweep, command = tmp_path / "sweep", ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", *TINY, "trainer.max_steps=1"]
    assert train_server.run(command).returncode == 0
    again = train_server.run(command)
    assert again.returncode == 2
    assert again.stderr.splitlines()[-1] == (
        f"error: 0_trainer.max_steps-1, a job of hydra.sweep.dir={sweep}, already holds checkpoints/last.pt; continue "
        "the sweep with trainer.resume=auto or give it another hydra.sweep.dir"
    )


def test_a_stopped_job_names_the_command_that_continues_its_whole_sweep(tmp_path):
    """SIGTERM in the first of two jobs: the log named a command for that job alone (hydra.run.dir,
    which no -m run reads), and the job after it was never run. The command it names now runs the
    sweep again in its dir: the stopped job goes on from its last.pt, the next one starts."""
    sweep = tmp_path / "sweep"
    signal_once = ["model._target_=tests.faults.SignalingNet", "+model.at_step=2", f"+model.once={tmp_path / 'sent'}"]
    stopped = train_server.run(
        ["-m", f"hydra.sweep.dir={sweep}", *TINY, "trainer.epochs=1", *signal_once, "optimizer.lr=0.1,0.05"]
    )
    assert stopped.returncode == 143, stopped.stderr
    command = re.search(r"resume with: (.*)$", stopped.stdout + stopped.stderr, re.MULTILINE)[1]
    assert command == (
        f"python train.py -m {' '.join(TINY)} trainer.epochs=1 {' '.join(signal_once)} optimizer.lr=0.1,0.05 "
        f"hydra.sweep.dir={sweep} trainer.resume=auto"
    )
    assert [p.name for p in sweep.glob("*/checkpoints")] == ["checkpoints"]
    continued = train_server.run(shlex.split(command)[2:])
    assert continued.returncode == 0, continued.stderr
    jobs = sorted(p for p in sweep.iterdir() if (p / "metrics.json").is_file())
    assert len(jobs) == 2
    starts = [re.findall(r"from epoch (\d+)(?: batch (\d+))?", (job / "train.log").read_text()) for job in jobs]
    assert starts == [[("1", ""), ("1", "3")], [("1", "")]]  # after step 2, its batch 3


def test_ctrl_c_in_hydras_code_ends_the_run_or_sweep_in_one_line_that_continues_it(tmp_path):
    """Before, between and after jobs Hydra's code runs, which no run's handler covers: the
    KeyboardInterrupt was Hydra's traceback. One line now, 130, and the command that continues the
    whole sweep (or the run, which says it has ended)."""
    sweep, ctrl_c = tmp_path / "sweep", "+hydra.callbacks.ctrl_c._target_=tests.faults.CtrlCInHydra"
    stopped = train_server.run(
        ["-m", f"hydra.sweep.dir={sweep}", *TINY, "trainer.max_steps=1", ctrl_c, "trainer.seed=1,2"]
    )
    assert stopped.returncode == 130 and "Traceback" not in stopped.stderr, stopped.stderr
    interrupted = "interrupted by Ctrl-C (SIGINT) outside the run, in Hydra's code; continue with: python train.py"
    assert stopped.stderr.splitlines()[-1] == (
        f"{interrupted} -m {ctrl_c} {' '.join(TINY)} trainer.max_steps=1 trainer.seed=1,2 hydra.sweep.dir={sweep} "
        "trainer.resume=auto"
    )
    assert [p.name for p in sweep.glob("*/metrics.json")] == ["metrics.json"]  # the first job's, kept
    run = tmp_path / "run"
    ended = train_server.run([f"hydra.run.dir={run}", *TINY, "trainer.max_steps=1", ctrl_c])  # as the job ends
    assert (ended.returncode, ended.stderr.splitlines()[-1]) == (
        130,
        f"{interrupted} {ctrl_c} {' '.join(TINY)} trainer.max_steps=1 hydra.run.dir={run} trainer.resume=auto",
    )
    before = train_server.run([f"hydra.run.dir={run}", ctrl_c, "+hydra.callbacks.ctrl_c.at=on_run_start"])
    assert (before.returncode, before.stderr.splitlines()[-1]) == (
        130,
        "interrupted by Ctrl-C (SIGINT) before a run started",
    )


def test_the_jobs_are_typed_once_per_sweep_process_not_once_per_job(tmp_path, monkeypatch):
    # Each job typed them all again: a sweep of N jobs paid N x N typings (~0.1 s each).
    record = tmp_path / "multirun.yaml"
    record.write_text(yaml.safe_dump({"hydra": {"sweeper": {}, "overrides": {"task": ["trainer.max_steps=2,4"]}}}))
    calls = []
    monkeypatch.setattr(typed_module, "typed", lambda cfg: calls.append(cfg.trainer.max_steps))
    for _ in range(3):  # the sweep's three jobs, one after another in this process
        typed_module.check_sweep(record)
    assert calls == [2, 4]

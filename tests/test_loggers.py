"""The logger backends, each read back with the tool its users read it with: the CSV with pandas,
W&B's offline run file with W&B's own record type, the MLflow store through MlflowClient; one
`python train.py` run (and its resume) logging to all three, profiled, its model summarized; and the
pre-flight's checks of the logger and profiler keys."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from config.overrides import check_overrides
from config.schema import LoggerConfig, MlflowConfig, WandbConfig
from errors import ConfigError
from preflight import check_and_plan
from tests.configs import job_config, typed_config
from tests.runs import run_train, wandb_records

FINAL = {"val_acc": 0.97, "best_val_acc": 0.98, "steps": 100, "peak_memory_mb": None, "devices": 1}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A sweep's job: `python train.py -m optimizer.lr=0.1,0.2 trainer.epochs=2`, its first."""
    sweep = tmp_path_factory.mktemp("multirun") / "2026-11-26" / "18-55-00"
    run_dir = sweep / "0_optimizer.lr-0.1+trainer.epochs-2"
    run_dir.mkdir(parents=True)
    return replace(job_config(run_dir, "optimizer.lr=0.1", "trainer.epochs=2"), sweep_dir=sweep)


def test_logger_options_compose_alone_or_as_a_list():
    assert typed_config().logger == LoggerConfig(tensorboard=True)  # logger=tensorboard, the default
    chosen = typed_config("logger=[tensorboard,csv,wandb,mlflow]", "logger.mlflow.tracking_uri=http://h:5000").logger
    assert chosen == LoggerConfig(
        tensorboard=True, csv=True, wandb=WandbConfig(), mlflow=MlflowConfig(tracking_uri="http://h:5000")
    )
    alone = typed_config("logger=csv").logger  # CSV alone: no TensorBoard left on from a default
    assert (alone.tensorboard, alone.csv, alone.wandb, alone.mlflow) == (False, True, None, None)


def test_csv_is_a_row_per_step_a_column_per_tag_and_a_resume_rewrites_the_steps_it_runs_again(job):
    from training.loggers.csv import CsvLogger

    logger = CsvLogger(LoggerConfig(csv=True), job)
    logger.log_scalars(0, {"train/loss": 2.5, "lr": 0.1})
    logger.log_scalars(50, {"train/loss": 1.25, "lr": 0.1})
    logger.log_scalars(50, {"val/acc": 0.5})  # a new tag at a step already written: one row, wider
    logger.log_scalars(100, {"train/loss": 0.75, "lr": 0.05})
    logger.log_scalars(100, {"val/acc": 0.875})
    read = pd.read_csv(job.run_dir / "metrics.csv")  # flushed: readable while the run goes on
    assert list(read.columns) == ["step", "train/loss", "lr", "val/acc"]
    assert read["step"].tolist() == [0, 50, 100] and read["train/loss"].tolist() == [2.5, 1.25, 0.75]
    assert np.isnan(read["val/acc"][0]) and read["val/acc"][1:].tolist() == [0.5, 0.875]
    logger.close()

    with (job.run_dir / "metrics.csv").open("a") as f:
        f.write("1")  # the kill cut off row "150,...": read whole, it would be a row at step 1
    resumed = CsvLogger(LoggerConfig(csv=True), job)  # resumed from the step-50 checkpoint
    resumed.log_scalars(100, {"train/loss": 0.625, "lr": 0.05})
    resumed.log_hparams({"model": "mnist_net", "lr": 0.1}, FINAL)
    resumed.close()
    read = pd.read_csv(job.run_dir / "metrics.csv")
    assert read["step"].tolist() == [0, 50, 100] and read["train/loss"].tolist() == [2.5, 1.25, 0.625]
    assert np.isnan(read["val/acc"][2])  # step 100's old validation went with the step

    table = pd.concat([pd.read_csv(job.run_dir / "hparams.csv")] * 2)  # a sweep's, one row per job
    assert list(table.columns) == ["model", "lr", *FINAL] and table["best_val_acc"].tolist() == [0.98, 0.98]


def test_a_single_run_is_named_by_its_overrides_or_else_its_dir_and_belongs_to_no_sweep(job):
    from training.loggers.naming import run_name, sweep_name

    single = replace(job, sweep_dir=None, swept={})
    assert (run_name(single), sweep_name(single)) == ("0_optimizer.lr-0.1+trainer.epochs-2", None)
    assert (run_name(job), sweep_name(job)) == ("optimizer.lr=0.1 trainer.epochs=2", "2026-11-26/18-55-00")


def test_a_logger_whose_package_is_missing_is_one_line_naming_the_requirements_file(monkeypatch):
    from training.loggers import packages

    monkeypatch.setitem(packages.PACKAGES, "wandb", "wandb_not_installed")
    cfg = LoggerConfig(tensorboard=True, wandb=WandbConfig())
    for attempt in (lambda: packages.check_installed(cfg), lambda: packages.import_for("wandb")):
        with pytest.raises(ConfigError) as error:
            attempt()
        assert str(error.value) == (
            "logger=wandb needs wandb_not_installed, which is not installed: "
            "pip install -r requirements-extras.txt (or leave it out of logger=)"
        )
    packages.check_installed(LoggerConfig(tensorboard=True, csv=True))
    with pytest.raises(ConfigError, match="^logger=wandb needs wandb_not_installed"):  # before launch
        check_and_plan(typed_config("logger=wandb"))


# Two epochs of 5 batches, stopped at step 8, then resumed to step 10: a row every 2 steps and at
# each epoch's end (5, 10); steps 6 and 7 profiled, after the profiler's 3 skipped and 2 warm-up steps.
LOGGED = ["logger=[csv,wandb,mlflow]", "debug=limit", "trainer.epochs=2", "trainer.log_every_n_steps=2"]
STEPS = [2, 4, 5, 6, 8, 10]
MNIST_NET = {
    "parameters": 53_002,
    "trainable_parameters": 53_002,
    "model_mb": 0.212,
    "flops_per_sample": 2 * (32 * 9 * 36 + 64 * 32 * 9 * 16 + 256 * 128 + 128 * 10),
}  # tests/test_summary.py


@pytest.fixture(scope="module")
def logged(memory_dir):
    """`python train.py` with every logger but TensorBoard and trainer.profile, stopped at step 8,
    then resumed in its run dir to step 10."""
    run_dir = memory_dir / "logged" / "run"
    with pytest.MonkeyPatch.context() as env:  # the train server's runs take this process's environment
        for variable in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_API_KEY", "MLFLOW_TRACKING_URI"):
            env.delenv(variable, raising=False)
        for variable in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):  # not the user's home
            env.setenv(variable, str(run_dir.parent / variable))
        for overrides in (
            ["trainer.max_steps=8", "trainer.profile=2"],
            ["trainer.max_steps=10", "trainer.resume=auto"],
        ):
            result = run_train(run_dir, *LOGGED, *overrides)
            assert result.returncode == 0, result.stderr[-3000:]
            if "trainer.profile=2" in overrides:
                (run_dir.parent / "console.txt").write_text(result.stdout + result.stderr)
    return run_dir


@pytest.mark.slow
def test_the_csv_of_a_run_and_its_resume_reads_as_one_unbroken_run(logged):
    table = pd.read_csv(logged / "metrics.csv")
    assert table["step"].tolist() == STEPS
    assert table["val/acc"].notna().tolist() == [False, False, True, False, True, True]  # epoch 1, the stop, epoch 2
    assert table["val/acc"].iloc[-1] == json.loads((logged / "metrics.json").read_text())["val_acc"]
    hparams = pd.read_csv(logged / "hparams.csv")
    assert hparams[list(MNIST_NET)].iloc[0].round(3).to_dict() == MNIST_NET


@pytest.mark.slow
def test_an_epoch_resumed_mid_way_reports_the_figures_of_all_its_batches(logged):
    """Epoch 2 is steps 6-10: stopped after 3 of its 5 full batches (train/loss at step 8 is theirs),
    its last 2 trained by the resume (the window at step 10): its train/loss is of all 5."""
    table = pd.read_csv(logged / "metrics.csv").set_index("step")
    metrics = json.loads((logged / "metrics.json").read_text())
    for figure, final in (("loss", "train_loss"), ("acc", "train_acc")):
        stopped, resumed = table.at[8, f"train/{figure}"], table.at[10, f"train/{figure}_window"]
        assert table.at[10, f"train/{figure}"] == pytest.approx((3 * stopped + 2 * resumed) / 5)
        assert metrics[final] == table.at[10, f"train/{figure}"]


@pytest.mark.slow
def test_a_resumed_runs_clock_and_speed_are_the_whole_runs(logged):
    """time/train_s goes on from the stop's, not from 0; the median samples/s is over every epoch's
    part after the first (the stop's and the resume's), and wall_s counts the stopped part's time."""
    table = pd.read_csv(logged / "metrics.csv")
    clock = table["time/train_s"].dropna().tolist()  # epoch 1, the stop, epoch 2
    assert len(clock) == 3 and clock == sorted(clock)
    speeds = table["throughput/samples_per_s"].dropna().tolist()
    metrics = json.loads((logged / "metrics.json").read_text())
    assert metrics["train_samples_per_s"] == pytest.approx(statistics.median(speeds[1:]))
    assert table["throughput/median_samples_per_s"].iloc[-1] == pytest.approx(metrics["train_samples_per_s"])
    assert metrics["wall_s"] > clock[1]


@pytest.mark.slow
def test_wandb_continues_the_run_it_started_offline_with_the_config_history_and_summary(logged):
    run_id = (logged / "wandb" / "run_id").read_text().strip()
    first, second = sorted((logged / "wandb").glob(f"offline-run-*-{run_id}"))  # one per process, one run
    history, summary, runs = {}, {}, []
    for run_dir in (first, second):
        records = list(wandb_records(next(run_dir.glob("run-*.wandb"))))
        runs += [r.run for r in records if r.HasField("run")]
        history.update(
            {
                r.history.step.num: {"/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
                for r in records
                if r.HasField("history")
            }
        )
        summary.update(
            {
                i.key: json.loads(i.value_json)
                for r in records
                if r.HasField("summary")
                for i in r.summary.update
                if i.key
            }
        )
    assert [(run.run_id, run.run_group) for run in runs] == [(run_id, "")] * 2
    assert "trainer.max_steps=8" in runs[0].display_name  # a single run: named by its overrides, in no sweep
    config = {item.key: json.loads(item.value_json) for item in runs[0].config.update}
    assert config["trainer"]["epochs"] == 2 and config["hparams"]["model"] == "mnist_net"
    table = pd.read_csv(logged / "metrics.csv")
    assert sorted(history) == STEPS
    assert [history[s].get("train/loss") for s in STEPS] == table["train/loss"].replace({float("nan"): None}).tolist()
    assert history[5]["val/samples/_type"] == "image-file"  # the sample grid, which W&B takes
    assert list(first.glob(f"files/{history[5]['val/samples/path']}"))
    metrics = json.loads((logged / "metrics.json").read_text())
    assert summary["best_val_acc"] == metrics["best_val_acc"] and summary["steps"] == 10
    assert {key: summary[key] for key in MNIST_NET} == {**MNIST_NET, "model_mb": metrics["model_mb"]}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning:mlflow.*")  # MLflow's own use of SQLAlchemy
def test_mlflow_continues_its_run_in_a_store_under_the_run_dir(logged):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{logged / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("runs").experiment_id])
    assert run.info.run_id == (logged / "mlflow_run_id").read_text().strip() and run.info.status == "FINISHED"
    assert run.data.params["model"] == "mnist_net" and run.data.params["parameters"] == "53002"
    metrics = json.loads((logged / "metrics.json").read_text())
    assert run.data.metrics["best_val_acc"] == metrics["best_val_acc"] and run.data.metrics["steps"] == 10
    history = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/loss")]
    table = pd.read_csv(logged / "metrics.csv")[["step", "train/loss"]].dropna()  # the epochs' ends, and the stop
    assert history == [(int(step), loss) for step, loss in table.itertuples(index=False)]
    artifacts = Path(run.info.artifact_uri.removeprefix("file://"))
    assert artifacts.is_relative_to(logged / "mlartifacts")
    assert json.loads((artifacts / "final_metrics.json").read_text()) == metrics
    assert "max_steps: 10" in (artifacts / "config.yaml").read_text() and list(artifacts.glob("images/*.png"))


@pytest.mark.slow
def test_trainer_profile_traces_its_steps_after_the_warm_up_and_logs_the_top_operators(logged):
    events = json.loads((logged / "profile" / "trace.json").read_text())["traceEvents"]  # Chrome's format
    steps = sorted(e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#5", "ProfilerStep#6"]  # after steps 0-2 (skipped) and 3-4 (warm-up)
    # The profiler's libraries' own lines (kineto's profiler_start, ...) in train.log, not on the console.
    console, log = (logged.parent / "console.txt").read_text(), (logged / "train.log").read_text()
    assert "] profiler_start" in log and "] profiler_start" not in console and "USDT" not in console
    assert any(e.get("name") == "aten::convolution_backward" and e.get("ph") == "X" for e in events)
    log = (logged / "train.log").read_text()
    assert log.count("profiled 2 steps, top operators by self CPU time") == 1  # the resume profiles nothing
    assert str(logged / "profile" / "trace.json") in log and "aten::mkldnn_convolution" in log


@pytest.mark.slow
def test_the_model_summary_is_logged_at_start_and_kept_in_metrics_json(logged):
    metrics = json.loads((logged / "metrics.json").read_text())
    assert {key: round(metrics[key], 3) for key in MNIST_NET} == MNIST_NET
    log = (logged / "train.log").read_text()
    assert log.count("model: 53,002 parameters (53,002 trainable), 0.21 MB, 0.68 MFLOPs per sample") == 2


def test_the_sample_grid_is_drawn_only_for_a_logger_that_takes_images():
    from training.loggers import takes_images

    assert not takes_images(typed_config("logger=csv").logger) and not takes_images(typed_config("logger=none").logger)
    assert all(
        takes_images(typed_config(f"logger=[csv,{option}]").logger) for option in ("tensorboard", "wandb", "mlflow")
    )


def test_options_of_a_logger_the_run_does_not_choose_are_one_line_naming_the_choice():
    def refusal(*overrides):
        with pytest.raises(ConfigError) as error:
            check_overrides(overrides)
        return str(error.value)

    assert refusal("logger.wandb.project=p") == (
        "logger.wandb.project=p sets an option of logger=wandb, which this run does not choose; add it: "
        "logger=wandb, or a list such as 'logger=[tensorboard,wandb]'"
    )
    assert refusal("debug=default", "logger.mlflow.experiment=e").startswith("logger.mlflow.experiment=e sets")
    assert refusal("-m", "logger=wandb,csv", "logger.wandb.tags=[a]").startswith("logger.wandb.tags=[a] sets")
    check_overrides(["logger=wandb", "logger.wandb.project=p"])
    check_overrides(["-m", "logger=[csv,mlflow],[mlflow]", "logger.mlflow.experiment=e", "trainer.epochs=2"])


@pytest.mark.slow
def test_train_py_refuses_them_before_hydra_composes(run_dir):
    result = run_train(run_dir, "logger.mlflow.experiment=e")
    assert (result.returncode, result.stderr) == (
        2,
        "error: logger.mlflow.experiment=e sets an option of "
        "logger=mlflow, which this run does not choose; add it: "
        "logger=mlflow, or a list such as 'logger=[tensorboard,mlflow]'\n",
    )
    assert not run_dir.exists()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["trainer.profile=0"], "trainer.profile=0: profile 1 or more optimizer steps, or null for none"),
        (
            ["debug=limit", "trainer.profile=11"],
            "trainer.profile=11 needs 16 optimizer steps (5 to warm the profiler up, then 11 recorded), and this run takes "
            "15 (trainer.epochs=3 x trainer.limit_train_batches=5); use trainer.profile=10 or fewer",
        ),
        (
            [
                "trainer.max_steps=6",
                "trainer.overfit_batches=3",
                "trainer.accumulate_grad_batches=2",
                "trainer.profile=2",
            ],
            "trainer.profile=2 needs 7 optimizer steps (5 to warm the profiler up, then 2 recorded), and this run takes 6 "
            "(trainer.max_steps=6); use trainer.profile=1 or fewer",
        ),
        (
            ["trainer.epochs=2", "trainer.overfit_batches=3", "trainer.accumulate_grad_batches=2", "trainer.profile=2"],
            "trainer.profile=2 needs 7 optimizer steps (5 to warm the profiler up, then 2 recorded), and this run takes 4 "
            "(trainer.epochs=2 x trainer.overfit_batches=3 / trainer.accumulate_grad_batches=2); train 7 or more steps",
        ),
    ],
)
def test_trainer_profile_is_refused_in_one_line_where_the_run_is_too_short_to_record_it(overrides, message):
    with pytest.raises(ConfigError) as error:
        check_and_plan(typed_config(*overrides))
    assert str(error.value) == message


@pytest.mark.slow
@pytest.mark.parametrize("choice, to_file", [("stdout", False), ("disabled", False), ("train", True)])
def test_hydras_own_job_logging_choices_replace_ours_whole(run_dir, choice, to_file):
    """hydra/job_logging=stdout, disabled, ...: our train.log's setting (its file opened at the first
    record) merged into them named a `file` handler with no class, a traceback before the run."""
    result = run_train(run_dir, "debug=fdr", f"hydra/job_logging={choice}")
    assert result.returncode == 0, result.stderr
    assert (run_dir / "metrics.json").is_file()
    log = run_dir / "train.log"
    written = log.read_text() if log.exists() else ""
    assert ("run dir:" in written) == to_file, written


@pytest.mark.filterwarnings("ignore::DeprecationWarning:mlflow.*")  # MLflow's own use of SQLAlchemy
def test_mlflow_holds_one_point_a_step_when_a_resumed_run_trains_steps_again(memory_dir, monkeypatch):
    """Killed after logging step 6, its last.pt at step 4: the resumed process logs steps 5 and 6
    again. MLflow cannot delete the first points, so the second are not logged: one point a step."""
    from mlflow.tracking import MlflowClient

    from training.loggers.mlflow import MlflowLogger

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    job = job_config(memory_dir / "mlflow_resumed" / "run", "logger=mlflow")
    killed = MlflowLogger(job.logger, job)
    for step in (2, 4, 5, 6):  # every 2 steps and at epoch 1's end (5)
        killed.log_scalars(step, {"train/loss": 1 / step})  # then it dies, its run never closed
    resumed = MlflowLogger(job.logger, job)
    for step in (5, 6, 8, 10):
        resumed.log_scalars(step, {"train/loss": 1 / step + 1, **({"val/acc": 0.5} if step in (5, 10) else {})})
    resumed.log_hparams({}, {"steps": 10, "best_val_acc": 0.5})
    resumed.close()
    client = MlflowClient(f"sqlite:///{job.run_dir / 'mlflow.db'}")
    run_id = (job.run_dir / "mlflow_run_id").read_text().strip()
    history = {
        key: [(m.step, m.value) for m in client.get_metric_history(run_id, key)]
        for key in ("train/loss", "val/acc", "best_val_acc")
    }
    assert history == {
        "train/loss": [(2, 1 / 2), (4, 1 / 4), (5, 1 / 5), (6, 1 / 6), (8, 1 / 8 + 1), (10, 1 / 10 + 1)],
        "val/acc": [(5, 0.5), (10, 0.5)],
        "best_val_acc": [(10, 0.5)],  # the final figures, at the last step
    }

"""bench.report: runs named by their overrides, speed-up only between runs that differ in devices alone."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
from tensorboard.plugins.hparams import plugin_data_pb2

from bench import report
from tests import train_server
from tests.runs import FORK_RANKS
from training.loggers.tensorboard import HPARAM_METRICS

TINY = (
    "trainer.accelerator=cpu",
    "trainer.epochs=1",
    "trainer.limit_train_batches=3",
    "trainer.limit_val_batches=1",
    "trainer.progress_bar=false",
)


def _write(root, name, overrides=None, **metrics):
    run = root / name
    run.mkdir(parents=True)
    base = {
        "val_acc": 0.9,
        "best_val_acc": 0.95,
        "wall_s": 10.0,
        "model": "m",
        "dataset": "d",
        "batch_size": 64,
        "train_samples_per_s": 100.0,
    }
    (run / "metrics.json").write_text(json.dumps({**base, **metrics}) + "\n")
    if overrides is not None:  # as Hydra records them
        (run / ".hydra").mkdir()
        (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))


def _record(run_dir: Path, overrides: list[str], config: dict, choices: dict) -> None:
    """A run's .hydra/ as Hydra writes it: its overrides, its config, its group choices (hydra.yaml)."""
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (run_dir / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"runtime": {"choices": choices}}}))


def _parent_of_sweeps_and_a_search(root: Path) -> Path:
    """multirun/ as two sweeps, a search and outputs/ leave it (dated dirs: the year is no job number)."""
    defaults = {"optimizer": "sgd", "model": "mnist_net", "hparams_search": None}
    config = {"optimizer": {"lr": 0.05, "weight_decay": 5e-4}, "trainer": {"batch_size": 64, "epochs": 15}}

    def run(path, overrides, choices=(), lr=0.05, decay=5e-4, batch=64, **metrics):
        _write(root, path, **metrics)
        used = {
            **config,
            "optimizer": {"lr": lr, "weight_decay": decay},
            "trainer": {"batch_size": batch, "epochs": 15},
        }
        _record(root / path, overrides, used, {**defaults, **dict(choices)})

    run("2026-11-26/10-00-00/0_model-simple_cnn", ["model=simple_cnn"], {"model": "simple_cnn"})
    run("2026-11-26/10-00-00/1_model-mnist_net", ["model=mnist_net"])
    run("2026-11-26/11-00-00/0_optimizer-adamw", ["optimizer=adamw"], {"optimizer": "adamw"}, lr=1e-3, decay=0.01)
    for trial, (lr, decay, batch) in enumerate(
        [(0.03028525153605885, 0.0007257005721594283, 128), (0.015171717849735478, 0.0036905577292137633, 16)]
    ):
        run(
            f"search/digits/{trial}_optimizer.lr-{lr:.4g}",
            [
                "hparams_search=digits",
                f"optimizer.lr={lr}",
                f"optimizer.weight_decay={decay}",
                f"trainer.batch_size={batch}",
            ],
            {"hparams_search": "digits"},
            lr=lr,
            decay=decay,
            batch=batch,
            best_val_acc=0.5 + trial / 10,
        )
    run("2026-11-27/09-00-00", [])  # outputs/: a plain run, no overrides
    return root


def test_labels_come_from_each_runs_own_overrides_never_its_path(tmp_path):
    runs = report.load_runs(_parent_of_sweeps_and_a_search(tmp_path))
    keys = report.swept_keys(runs)
    assert keys == [
        "model",
        "optimizer",
        "hparams_search",
        "optimizer.lr",
        "optimizer.weight_decay",
        "trainer.batch_size",
    ]
    labels = {run.name.split("/")[-1]: report.label(run, keys) for run in runs}
    assert labels == {
        "0_model-simple_cnn": "model=simple_cnn",
        "1_model-mnist_net": "model=mnist_net",
        "0_optimizer-adamw": "optimizer=adamw",
        "09-00-00": "(defaults)",
        "0_optimizer.lr-0.03029": "hparams_search=digits optimizer.lr=0.03029 optimizer.weight_decay=0.0007257 "
        "trainer.batch_size=128",
        "1_optimizer.lr-0.01517": "hparams_search=digits optimizer.lr=0.01517 optimizer.weight_decay=0.003691 "
        "trainer.batch_size=16",
    }
    # The same overrides twice (outputs/ holds many runs of the default job): numbered, in the table's order.
    (plain,) = [run for run in runs if run.name == "2026-11-27/09-00-00"]
    again = report.Run(**{**vars(plain), "name": "2026-11-28/09-00-00"})
    assert report.plot_labels([plain, again], keys) == {plain.name: "(defaults)", again.name: "(defaults) (2)"}
    # A search's long labels, shortened, keep their first and last overrides whole.
    shortened = report.plot_labels(runs, keys)
    assert shortened["search/digits/0_optimizer.lr-0.03029"] == "hparams_search=digits … trainer.batch_size=128"


def test_every_column_shows_what_the_run_used_be_it_an_override_or_a_default(tmp_path):
    runs = report.load_runs(_parent_of_sweeps_and_a_search(tmp_path))
    header, _, *lines = report.markdown(report.rows(runs)).splitlines()
    cells = {line.split(" | ")[-1].rstrip(" |").split("/")[-1]: line.split(" | ")[:5] for line in lines}
    assert header.split(" | ")[:5] == [
        "| optimizer",
        "hparams_search",
        "optimizer.lr",
        "optimizer.weight_decay",
        "strategy",
    ]  # model and batch: columns of their own
    assert cells["0_optimizer.lr-0.03029"] == ["| sgd", "digits", "0.03029", "0.0007257", "?"]  # sgd: its default
    assert cells["0_optimizer-adamw"] == ["| adamw", "null", "0.001", "0.01", "?"]  # adamw's own lr and decay
    assert cells["09-00-00"] == ["| sgd", "null", "0.05", "0.0005", "?"]
    assert not any(" — " in " | ".join(c) for c in cells.values())  # every run kept its record


def test_a_key_set_on_the_command_line_to_what_the_other_runs_used_tells_no_run_apart(tmp_path):
    for name, overrides, epochs in [
        ("a", ["optimizer=adadelta", "optimizer.lr=1"], 15),
        ("b", [], 15),
        ("c", ["trainer.epochs=2"], 2),
    ]:
        _write(tmp_path, name)
        _record(
            tmp_path / name,
            overrides,
            {"optimizer": {"lr": 1.0}, "trainer": {"epochs": epochs}},
            {"optimizer": "adadelta"},
        )
    runs = report.load_runs(tmp_path)
    assert report.swept_keys(runs) == ["trainer.epochs"]  # adadelta and its lr 1 (1.0) were every run's
    assert [report.label(run, ["trainer.epochs"]) for run in runs] == [
        "(shared overrides only)",
        "(defaults)",
        "trainer.epochs=2",
    ]


def test_a_plot_shortens_long_labels_in_the_middle_maps_them_and_each_trial_in_a_legend(tmp_path):
    root = _parent_of_sweeps_and_a_search(tmp_path)
    runs, search = (
        report.load_runs(root / "search" / "digits"),
        {
            "metric": "best_val_acc",
            "direction": "maximize",
            "best_trial": 1,
            "best_value": 0.6,
            "trials": [
                {
                    "number": 0,
                    "state": "COMPLETE",
                    "value": 0.5,
                    "params": {"optimizer.lr": 0.03028525153605885, "trainer.batch_size": 128},
                },
                {
                    "number": 1,
                    "state": "COMPLETE",
                    "value": 0.6,
                    "params": {"optimizer.lr": 0.015171717849735478, "trainer.batch_size": 16},
                },
                {
                    "number": 2,
                    "state": "FAIL",
                    "value": None,
                    "params": {"optimizer.lr": 0.4, "trainer.batch_size": 16},
                },
            ],
        },
    )
    fig = report.figure(report.rows(runs), search)
    per_configuration, _, trials = fig.axes
    shown = [tick.get_text() for tick in per_configuration.get_yticklabels()]
    assert shown == ["optimizer.lr=0.03029 … trainer.batch_size=128", "optimizer.lr=0.01517 … trainer.batch_size=16"]
    assert fig.texts[0].get_text().splitlines() == [  # under the plots
        "optimizer.lr=0.03029 … trainer.batch_size=128: hparams_search=digits optimizer.lr=0.03028525153605885 "
        "optimizer.weight_decay=0.0007257005721594283 trainer.batch_size=128",
        "optimizer.lr=0.01517 … trainer.batch_size=16: hparams_search=digits optimizer.lr=0.015171717849735478 "
        "optimizer.weight_decay=0.0036905577292137633 trainer.batch_size=16",
        "trial 0: optimizer.lr=0.03029 trainer.batch_size=128",
        "trial 1: optimizer.lr=0.01517 trainer.batch_size=16",
        "trial 2: optimizer.lr=0.4 trainer.batch_size=16 (fail)",
    ]
    assert all(tick == int(tick) for tick in trials.get_xticks())  # trials 0, 1: no tick at 0.5


def _run(name="r", strategy="ddp", devices=1, batch_size=64, samples_per_s=100.0, overrides=()):
    return report.Run(
        name, strategy, devices, "m", "d", batch_size, samples_per_s, 0.9, 0.95, 10.0, None, overrides=tuple(overrides)
    )


def test_speedup_is_the_throughput_ratio_and_efficiency_its_share_of_ideal():
    assert report.scaling(300.0, 4, 100.0) == pytest.approx((3.0, 0.75))
    assert report.scaling(50.0, 1, 100.0) == pytest.approx((0.5, 0.5))


def test_baseline_is_the_one_device_run_that_differs_in_device_count_alone():
    single, dp1, ddp1 = _run("s", "single"), _run("dp1", "dp"), _run("ddp1", "ddp")
    ddp4, other_batch = _run("ddp4", "ddp", devices=4), _run("b128", "single", batch_size=128)
    runs = [single, dp1, ddp1, ddp4, other_batch]
    assert report.baseline(ddp4, runs) is ddp1
    assert report.baseline(_run("dp2", "dp", devices=2), runs) is dp1
    assert report.baseline(_run("x4", "fsdp", devices=4), runs) is None  # another strategy is another thing
    assert report.baseline(_run("b32", devices=2, batch_size=32), runs) is None
    sgd1, adamw1 = (_run(o, overrides=[("optimizer", o), ("trainer.devices", "1")]) for o in ("sgd", "adamw"))
    adamw2 = _run("adamw2", devices=2, overrides=[("optimizer", "adamw"), ("trainer.devices", "2")])
    assert report.baseline(adamw2, [sgd1, adamw1, adamw2]) is adamw1
    assert report.baseline(adamw1, [sgd1, adamw1]) is adamw1 and report.baseline(sgd1, [adamw1]) is None


def test_rows_compute_speedup_per_workload(tmp_path):
    _write(tmp_path, "0", strategy="ddp", devices=1, world_size=1, train_samples_per_s=100.0)
    _write(tmp_path, "1", strategy="ddp", devices=2, world_size=2, train_samples_per_s=180.0)
    _write(tmp_path, "2", strategy="ddp", devices=2, world_size=2, train_samples_per_s=90.0, batch_size=32)
    rows = {row.run.name: row for row in report.rows(report.load_runs(tmp_path))}
    assert (rows["0"].speedup, rows["0"].efficiency) == pytest.approx((1.0, 1.0))
    assert (rows["1"].speedup, rows["1"].efficiency) == pytest.approx((1.8, 0.9))
    assert (rows["2"].speedup, rows["2"].efficiency) == (None, None)


def test_old_and_new_metrics_files_both_load(tmp_path, capsys):
    # Before devices/batch_size were recorded: devices from world_size, batch unknown.
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "metrics.json").write_text(
        json.dumps(
            {
                "val_acc": 0.5,
                "best_val_acc": 0.6,
                "train_samples_per_s": 10.0,
                "wall_s": 3.0,
                "world_size": 2,
                "strategy": "ddp",
                "model": "m",
                "dataset": "d",
                "epochs": 1,
                "steps": 5,
            }
        )
    )
    _write(tmp_path, "new", strategy="dp", devices=4, world_size=1, train_samples_per_s=1.0, peak_memory_mb=[900, 1200])
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "metrics.json").write_text('{"val_acc": 0.5}')
    (tmp_path / "evaluated").mkdir()  # trainer.test_only's metrics.json, as training/evaluation.py writes it
    (tmp_path / "evaluated" / "metrics.json").write_text(
        json.dumps(
            {
                "val_acc": 0.5,
                "val_acc5": 0.9,
                "val_loss": 1.0,
                "val_samples": 360,
                "weights": "model",
                "model": "m",
                "dataset": "d",
                "world_size": 1,
                "batch_size": 64,
                "wall_s": 1.0,
            }
        )
    )
    runs = {run.name: run for run in report.load_runs(tmp_path)}
    assert sorted(runs) == ["new", "old"]
    skipped = capsys.readouterr().err.splitlines()
    assert skipped == [
        f"skipped {tmp_path / 'broken' / 'metrics.json'}: not a metrics.json written by train.py "
        "(KeyError: 'train_samples_per_s')",
        f"skipped {tmp_path / 'evaluated' / 'metrics.json'}: a trainer.test_only evaluation, not a training run",
    ]
    assert (runs["old"].devices, runs["old"].batch_size, runs["old"].peak_memory_mb) == (2, None, None)
    assert (runs["new"].devices, runs["new"].batch_size, runs["new"].peak_memory_mb) == (4, 64, 1200)


def test_the_fullest_ranks_training_state_is_reported_beside_ddps(tmp_path):
    """fsdp's per-rank bytes against ddp's: parameters + gradients + optimizer state, largest rank."""
    _write(
        tmp_path,
        "ddp",
        strategy="ddp",
        devices=2,
        param_bytes_per_rank=[4e6, 4e6],
        grad_bytes_per_rank=[4e6, 4e6],
        optimizer_bytes_per_rank=[4e6, 4e6],
    )
    _write(
        tmp_path,
        "fsdp",
        strategy="fsdp",
        devices=2,
        param_bytes_per_rank=[2e6, 2.5e6],
        grad_bytes_per_rank=[2e6, 2.5e6],
        optimizer_bytes_per_rank=[2e6, 2.5e6],
    )
    runs = {run.name: run for run in report.load_runs(tmp_path)}
    assert (runs["ddp"].state_mb_per_rank, runs["fsdp"].state_mb_per_rank) == (12.0, 7.5)
    table = report.markdown(report.rows(list(runs.values())))
    assert "state MB/rank" in table and "| 12.0 |" in table and "| 7.5 |" in table


def test_markdown_shows_a_dash_where_there_is_no_figure():
    table = report.markdown(
        [report.Row(_run("0", devices=2, samples_per_s=1234.0), None, None), report.Row(_run("1"), 1.0, 1.0)]
    )
    header, _, no_baseline, baseline = table.splitlines()
    assert header.count("|") == no_baseline.count("|") == 14
    assert "| 2 | m | d | 64 | 1,234 | — | — | 90.00% | 95.00% | — | — | 0 |" in no_baseline
    assert "| 1.00× | 100% |" in baseline


def test_a_scaling_plot_names_each_line_by_what_it_is_apart_from_its_device_count():
    table = report.rows(
        [
            _run(
                f"{i}",
                devices=n,
                samples_per_s=100.0 * n,
                overrides=[("optimizer", optimizer), ("trainer.devices", str(n))],
            )
            for i, (optimizer, n) in enumerate((o, n) for o in ("sgd", "adamw") for n in (1, 2))
        ]
    )
    throughput = report.figure(table).axes[0]
    assert [text.get_text() for text in throughput.get_legend().get_texts()] == ["optimizer=sgd", "optimizer=adamw"]


def test_main_prints_the_table_and_writes_the_plot(tmp_path, capsys):
    _write(tmp_path, "0", strategy="ddp", devices=1, train_samples_per_s=100.0)
    _write(tmp_path, "1", strategy="ddp", devices=2, train_samples_per_s=150.0)
    assert report.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| 1.50× | 75% |" in out
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_runs_are_named_by_the_overrides_that_differ(tmp_path):
    for i, (model, optimizer) in enumerate(
        [("simple_cnn", "sgd"), ("simple_cnn", "adamw"), ("mnist_net", "sgd"), ("mnist_net", "adamw")]
    ):
        _write(
            tmp_path,
            f"{i}_x",
            [f"model={model}", f"optimizer={optimizer}", "trainer.epochs=2"],
            model=model,
            devices=1,
            train_samples_per_s=100.0 + i,
        )
    lr = "optimizer.lr=0.0031622776601683794"
    _write(tmp_path, "10_x", ["model=mnist_net", "optimizer=adamw", "trainer.epochs=2", lr], model="mnist_net")
    runs = report.load_runs(tmp_path)
    assert [r.name for r in runs] == ["0_x", "1_x", "2_x", "3_x", "10_x"]  # job 10 after job 3
    keys = report.swept_keys(runs)
    assert keys == ["model", "optimizer", "optimizer.lr"]  # trainer.epochs is the same everywhere
    assert report.label(runs[1], keys) == "model=simple_cnn optimizer=adamw"
    assert report.label(runs[4], keys) == "model=mnist_net optimizer=adamw optimizer.lr=0.003162"
    labels = report.plot_labels(runs, keys)  # the long one cut in the middle, not named by its dir's number
    assert (labels["1_x"], labels["10_x"]) == (report.label(runs[1], keys), "model=mnist_net … optimizer.lr=0.003162")
    header, _, *lines = report.markdown(report.rows(runs)).splitlines()
    assert header.startswith("| optimizer | optimizer.lr | strategy | devices | model |")  # model: its own column
    assert lines[1].startswith("| adamw | — | ? | 1 | simple_cnn |")
    assert all(line.count("| — | — |") == 2 for line in lines[:4])  # 1 device each: no speed-up; no bytes recorded
    assert all(row.speedup is None and row.efficiency is None for row in report.rows(runs))


def test_a_search_report_takes_the_best_trial_from_the_sweepers_results(tmp_path, capsys):
    for i, lr in enumerate(["0.01", "0.1"]):
        _write(tmp_path, str(i), [f"optimizer.lr={lr}"], best_val_acc=0.5 + i / 10)
    results = {
        "name": "optuna",
        "study_name": "digits",
        "metric": "best_val_acc",
        "direction": "maximize",
        "n_trials": 2,
        "complete": 2,
        "best_trial": 0,
        "best_value": 0.75,
        "best_params": {"optimizer.lr": 0.01},
        "best_job": "0",
        "trials": [{"number": 0, "state": "COMPLETE", "value": 0.75}, {"number": 1, "state": "COMPLETE", "value": 0.6}],
    }
    (tmp_path / "optimization_results.yaml").write_text(yaml.safe_dump(results))
    assert report.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    # The sweeper's word, not a maximum over metrics.json (which would say run 1).
    assert "Best: trial 0, best_val_acc = 0.75 (optimizer.lr=0.01), run 0" in out
    assert "2 of 2 trials complete, maximize best_val_acc" in out
    assert (tmp_path / "report.png").stat().st_size > 0


def test_main_without_runs_says_what_to_do(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    assert "no metrics.json under" in capsys.readouterr().err
    assert not (tmp_path / "report.png").exists()


def _sweep_and_report(sweep: Path, *overrides: str) -> tuple[list[str], str]:
    """Run `python train.py -m` (job dirs as conf/config.yaml names them), then bench.report on it: the
    table's lines, and what the sweep printed."""
    result = train_server.run(["-m", FORK_RANKS, f"hydra.sweep.dir={sweep}", *TINY, *overrides])
    assert result.returncode == 0, result.stderr[-3000:]
    # bench.report in this process (tests/test_sweeps.py runs it as `python -m bench.report`).
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert report.main([str(sweep)]) == 0
    assert (sweep / "report.png").stat().st_size > 0
    return [line for line in out.getvalue().splitlines() if line.startswith("|")], result.stdout


@pytest.fixture(scope="module")
def model_optimizer_sweep(tmp_path_factory) -> tuple[Path, list[str], str]:
    sweep = tmp_path_factory.mktemp("sweep") / "models"
    return sweep, *_sweep_and_report(sweep, "model=simple_cnn,mnist_net", "optimizer=sgd,adamw")


@pytest.mark.slow
def test_a_model_and_optimizer_sweep_reports_per_override_without_speedups(model_optimizer_sweep):
    sweep, (header, _, *lines), _ = model_optimizer_sweep
    assert header.startswith("| optimizer | strategy | devices | model |")
    assert f"| {HPARAM_METRICS['throughput/median_samples_per_s']} |" in header  # one samples/s, one title
    assert [line.split(" | ")[0] for line in lines] == ["| sgd", "| adamw", "| sgd", "| adamw"]
    assert all(line.count(" | — | — | ") == 1 for line in lines)  # speed-up, efficiency: nothing to compare
    # What each job used where it overrode nothing, from the .hydra/ files Hydra wrote.
    runs = report.load_runs(sweep)
    assert [(report.used(r, "optimizer.lr"), report.used(r, "scheduler")) for r in runs] == [
        ("0.05", "cosine"),
        ("0.001", "cosine"),
    ] * 2


@pytest.mark.slow
def test_tensorboard_names_each_sweep_run_by_its_overrides(model_optimizer_sweep):
    sweep, _, _ = model_optimizer_sweep
    runs = EventMultiplexer().AddRunsFromDirectory(str(sweep))
    runs.Reload()
    expected = {  # TensorBoard's run name -> the (model, optimizer, optimizer.lr) in its HParams row
        "0_model-simple_cnn+optimizer-sgd+trainer.epochs-1/tb": ("simple_cnn", "sgd", "0.05"),
        "1_model-simple_cnn+optimizer-adamw+trainer.epochs-1/tb": ("simple_cnn", "adamw", "0.001"),
        "2_model-mnist_net+optimizer-sgd+trainer.epochs-1/tb": ("mnist_net", "sgd", "0.05"),
        "3_model-mnist_net+optimizer-adamw+trainer.epochs-1/tb": ("mnist_net", "adamw", "0.001"),
    }
    assert sorted(runs.Runs()) == list(expected)
    for run, tags in runs.PluginRunToTagToContent("hparams").items():
        data = plugin_data_pb2.HParamsPluginData.FromString
        hparams = data(tags["_hparams_/session_start_info"]).session_start_info.hparams
        assert (
            hparams["model"].string_value,
            hparams["optimizer"].string_value,
            hparams["optimizer.lr"].string_value,
        ) == expected[run]
        assert hparams["trainer.epochs"].string_value == "1"  # as typed, not 1.0000
        # Differing: what the sweep varies and what its choices change (each optimizer's lr), not
        # trainer.epochs=1, which every job was given.
        experiment = data(tags["_hparams_/experiment"]).experiment
        assert [info.name for info in experiment.hparam_infos if info.differs] == ["model", "optimizer", "optimizer.lr"]


@pytest.mark.slow
def test_a_scaling_sweep_still_reports_speedup_and_efficiency(tmp_path):
    (header, _, one, two), _ = _sweep_and_report(tmp_path / "scaling", "sweep=scaling", "trainer.devices=1,2")
    assert header.startswith("| strategy | devices |")  # trainer.devices has its column: no extra one
    assert one.startswith("| ddp | 1 |") and "| 1.00× | 100% |" in one
    assert two.startswith("| ddp | 2 |") and "| — | — |" not in two
    assert one.endswith("| 0_strategy-ddp+trainer.devices-1+trainer.epochs-1 |")


@pytest.mark.slow
def test_a_sweep_says_where_it_writes_as_it_starts_and_ends_with_its_report_command(model_optimizer_sweep):
    sweep, _, printed = model_optimizer_sweep
    hydra = [line.split("[HYDRA] ", 1)[1] for line in printed.splitlines() if "[HYDRA] " in line]
    report_command = f"python -m bench.report {sweep}"
    assert hydra[0] == f"Sweep dir: {sweep} (a dir per job); once it ends, compare them: {report_command}"
    assert hydra[1].startswith("Launching 4 jobs")
    assert hydra[-1] == f"Sweep done, in {sweep}; compare its jobs: {report_command}"

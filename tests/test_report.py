"""bench.report: runs named by their overrides, speed-up only between runs that differ in devices alone."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import json_format
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2

from bench import report
from config.setup import ROOT
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
    """multirun/ as two sweeps, a search and outputs/ leave it (dated dirs: the year is no job number),
    each run with its record (hparams.json, as train.py writes it) and its overrides; each sweep with its multirun.yaml."""
    defaults = {"model": "mnist_net", "optimizer": "sgd", "optimizer.lr": 0.05, "optimizer.weight_decay": 5e-4}
    defaults |= {"trainer.batch_size": 64, "trainer.epochs": 15, "parameters": 53002}

    def run(path, overrides, best_val_acc=0.95, sweep=True, **used):
        _write(root, path, overrides, best_val_acc=best_val_acc)
        (root / path / "hparams.json").write_text(json.dumps({**defaults, **used}))
        if sweep:
            (root / path).parent.joinpath("multirun.yaml").write_text("hydra: {}\n")  # what makes it a sweep's job

    run("2026-11-26/10-00-00/0_model-simple_cnn", ["model=simple_cnn"], model="simple_cnn", parameters=21386)
    run("2026-11-26/10-00-00/1_model-mnist_net", ["model=mnist_net"])
    run("2026-11-26/11-00-00/0_optimizer-adamw", ["optimizer=adamw"], optimizer="adamw", **{"optimizer.lr": 1e-3})
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
            hparams_search="digits",
            best_val_acc=0.5 + trial / 10,
            **{"optimizer.lr": lr, "optimizer.weight_decay": decay, "trainer.batch_size": batch},
        )
    run("2026-11-27/09-00-00", [], sweep=False)  # outputs/: a plain run, no overrides
    return root


def test_every_column_is_a_key_that_differs_with_what_each_run_used_whichever_way_it_came_to(tmp_path):
    runs = report.load_runs(_parent_of_sweeps_and_a_search(tmp_path))
    assert [run.sweep for run in runs] == [
        *["2026-11-26/10-00-00"] * 2,
        "2026-11-26/11-00-00",
        None,
        *["search/digits"] * 2,
    ]
    header, _, *lines = report.markdown(report.rows(runs)).splitlines()
    # model and batch have columns of their own; parameters differs by the model, adamw's lr by its own default.
    assert header.split(" | ")[:6] == [
        "| optimizer",
        "optimizer.lr",
        "optimizer.weight_decay",
        "parameters",
        "hparams_search",
        "strategy",
    ]
    cells = {line.split(" | ")[-1].rstrip(" |").split("/")[-1]: line.split(" | ")[:5] for line in lines}
    assert cells == {
        "0_model-simple_cnn": ["| sgd", "0.05", "0.0005", "21386", "—"],
        "1_model-mnist_net": ["| sgd", "0.05", "0.0005", "53002", "—"],
        "0_optimizer-adamw": ["| adamw", "0.001", "0.0005", "53002", "—"],
        "09-00-00": ["| sgd", "0.05", "0.0005", "53002", "—"],
        "0_optimizer.lr-0.03029": ["| sgd", "0.03029", "0.0007257", "53002", "digits"],
        "1_optimizer.lr-0.01517": ["| sgd", "0.01517", "0.003691", "53002", "digits"],
    }


def test_labels_name_each_run_by_its_sweep_and_what_it_used_of_the_overridden_keys_that_differ(tmp_path):
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
    assert report.several_sweeps(runs)
    labels = {run.name: report.label(run, keys[:2], by_sweep=True) for run in runs}
    assert labels == {  # every run says its model and optimizer, overridden or not; a run of no sweep its dir
        "2026-11-26/10-00-00/0_model-simple_cnn": "2026-11-26/10-00-00: model=simple_cnn optimizer=sgd",
        "2026-11-26/10-00-00/1_model-mnist_net": "2026-11-26/10-00-00: model=mnist_net optimizer=sgd",
        "2026-11-26/11-00-00/0_optimizer-adamw": "2026-11-26/11-00-00: model=mnist_net optimizer=adamw",
        "2026-11-27/09-00-00": "2026-11-27/09-00-00: model=mnist_net optimizer=sgd",
        "search/digits/0_optimizer.lr-0.03029": "search/digits: model=mnist_net optimizer=sgd",
        "search/digits/1_optimizer.lr-0.01517": "search/digits: model=mnist_net optimizer=sgd",
    }
    # One sweep's runs: no sweep named; a search's sampled floats to 4 digits.
    search = report.load_runs(tmp_path / "search" / "digits")
    assert not report.several_sweeps(search)
    assert [report.label(run, report.swept_keys(search)) for run in search] == [
        "optimizer.lr=0.03029 optimizer.weight_decay=0.0007257 trainer.batch_size=128",
        "optimizer.lr=0.01517 optimizer.weight_decay=0.003691 trainer.batch_size=16",
    ]
    # The same sweep twice (its dir copied): each run after its sweep, not numbered.
    again = [report.Run(**{**vars(run), "name": "b/" + run.name, "sweep": "b"}) for run in search]
    plotted = report.plot_labels([*search, *again], report.swept_keys(search), by_sweep=True)
    assert len(set(plotted.values())) == 4 and plotted["b/0_optimizer.lr-0.03029"].startswith("b: optimizer.lr=0.03029")


def test_a_run_from_before_hparams_json_is_compared_by_its_hydra_record(tmp_path):
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
    assert [report.label(run, ["trainer.epochs"]) for run in runs] == ["trainer.epochs=15"] * 2 + ["trainer.epochs=2"]


def test_labels_never_print_over_each_other_and_each_figure_has_one_name(tmp_path):
    import matplotlib.pyplot as plt

    runs = report.load_runs(_parent_of_sweeps_and_a_search(tmp_path))  # several runs end alike: 10 s, 95%
    # A search's further trials (each label three lines).
    (trial,) = [run for run in runs if run.name.startswith("search/digits/0")]
    runs += [
        report.Run(**{**vars(trial), "name": f"search/digits/{i}", "record": {**trial.record, "optimizer.lr": i / 100}})
        for i in range(2, 10)
    ]
    fig = report.figure(report.rows(runs))
    per_configuration, accuracy = fig.axes
    assert not accuracy.texts  # its runs named in a legend beside it, in the table's order
    labels = report.plot_labels(runs, report.swept_keys(runs), by_sweep=True)
    assert [t.get_text() for t in accuracy.get_legend().get_texts()] == list(labels.values())
    fig.canvas.draw()
    boxes = [tick.get_window_extent() for tick in per_configuration.get_yticklabels()]
    assert len(boxes) == 14 and not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    titles = [ax.title.get_window_extent() for ax in fig.axes]
    assert not titles[0].overlaps(titles[1])
    names = {ax.get_xlabel() for ax in fig.axes} | {ax.get_ylabel() for ax in fig.axes}
    assert names == {"best_val_acc", "wall time (s)", ""}  # best_val_acc, the one name of the optimised figure
    plt.close(fig)


def test_a_plot_wraps_long_labels_cuts_longer_ones_in_the_middle_and_lists_each_trial_in_a_legend(tmp_path):
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
    per_configuration, trials, _ = fig.axes
    shown = [tick.get_text() for tick in per_configuration.get_yticklabels()]
    assert shown == [
        "optimizer.lr=0.03029\noptimizer.weight_decay=0.0007257\ntrainer.batch_size=128",
        "optimizer.lr=0.01517\noptimizer.weight_decay=0.003691\ntrainer.batch_size=16",
    ]
    assert fig.texts[0].get_text().splitlines() == [  # under the plots
        "trial 0: optimizer.lr=0.03029 trainer.batch_size=128",
        "trial 1: optimizer.lr=0.01517 trainer.batch_size=16",
        "trial 2: optimizer.lr=0.4 trainer.batch_size=16 (fail)",
    ]
    assert all(tick == int(tick) for tick in trials.get_xticks())  # trials 0, 1: no tick at 0.5
    long = report.Run(**{**vars(runs[0]), "record": {**runs[0].record, "optimizer.lr": "x" * 200}})
    (label,) = report.plot_labels([long], ["optimizer.lr"]).values()
    assert len(label.replace("\n", "")) <= report.LONGEST and "…" in label


def _run(name="r", strategy="ddp", devices=1, batch_size=64, samples_per_s=100.0, overrides=()):
    overrides = tuple(overrides)
    return report.Run(
        name,
        strategy,
        devices,
        "m",
        "d",
        batch_size,
        samples_per_s,
        0.9,
        0.95,
        10.0,
        None,
        overrides=overrides,
        record=dict(overrides),
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


def test_main_prints_the_table_and_writes_the_plot_where_asked_by_default_in_the_directory_saying_so(tmp_path, capsys):
    _write(tmp_path, "0", strategy="ddp", devices=1, train_samples_per_s=100.0)
    _write(tmp_path, "1", strategy="ddp", devices=2, train_samples_per_s=150.0)
    assert report.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| 1.50× | 75% |" in out
    png = tmp_path / "report.png"
    assert out.endswith(f"plot: {png} (in the directory reported on; --png PATH writes it elsewhere)\n")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    png.unlink()
    elsewhere = tmp_path.parent / f"{tmp_path.name}.png"
    assert report.main([str(tmp_path), "--png", str(elsewhere)]) == 0
    assert capsys.readouterr().out.endswith(f"plot: {elsewhere}\n")
    assert elsewhere.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not png.exists()
    # A --png it cannot write: one line before the table, not a traceback after it.
    blocked = tmp_path / "0" / "metrics.json" / "report.png"
    assert report.main([str(tmp_path), "--png", str(blocked)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (
        f"error: --png={blocked}: cannot write there ({tmp_path / '0' / 'metrics.json'} is a file, not a folder); "
        "give a path you can write\n"
    )


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
    # Each run says what it used of every key that differs: these runs kept no record of the lr they took.
    assert report.label(runs[1], keys) == "model=simple_cnn optimizer=adamw optimizer.lr=—"
    assert report.label(runs[4], keys) == "model=mnist_net optimizer=adamw optimizer.lr=0.003162"
    labels = report.plot_labels(runs, keys)  # the long one wrapped, not named by its dir's number
    assert labels["10_x"] == "model=mnist_net optimizer=adamw\noptimizer.lr=0.003162"
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
        "trials": [
            {"number": 0, "state": "COMPLETE", "value": 0.75},
            {"number": 1, "state": "FAIL", "value": None},
            {"number": 2, "state": "COMPLETE", "value": 0.6},
            {"number": 3, "state": "FAIL", "value": None},
        ],
    }
    (tmp_path / "optimization_results.yaml").write_text(yaml.safe_dump(results))
    assert report.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    # The sweeper's word, not a maximum over metrics.json (which would say run 1).
    assert "Best: trial 0, best_val_acc = 0.75 (optimizer.lr=0.01), run 0" in out
    assert "2 of 2 trials complete, 2 failed, maximize best_val_acc" in out  # what the table leaves out
    assert (tmp_path / "report.png").stat().st_size > 0


def test_a_run_that_never_finished_is_named_not_left_out_silently(tmp_path, capsys):
    # A sweep's killed job (its manifest.json, no metrics.json) vanished from the table without a word.
    (tmp_path / "1_optimizer.lr-0.1").mkdir()
    (tmp_path / "1_optimizer.lr-0.1" / "manifest.json").write_text("{}")
    assert report.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"skipped {tmp_path / '1_optimizer.lr-0.1'}: no metrics.json, the run has not finished" in err


def test_main_without_runs_says_what_to_do(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    assert "no metrics.json under" in capsys.readouterr().err
    assert not (tmp_path / "report.png").exists()


def _sweep_and_report(sweep: Path, *overrides: str, tiny: tuple[str, ...] = TINY) -> tuple[list[str], str]:
    """Run `python train.py -m` (job dirs as conf/config.yaml names them), then bench.report on it: the
    table's lines, and what the sweep printed."""
    result = train_server.run(["-m", FORK_RANKS, f"hydra.sweep.dir={sweep}", *tiny, *overrides])
    assert result.returncode == 0, result.stderr[-3000:]
    # bench.report in this process (tests/test_sweeps.py runs it as `python -m bench.report`).
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert report.main([str(sweep)]) == 0
    assert (sweep / "report.png").stat().st_size > 0
    return [line for line in out.getvalue().splitlines() if line.startswith("|")], result.stdout


def documented_sweep() -> list[str]:
    """The overrides of the 4-job sweep docs/sweeps.md shows beside its HParams screenshot (the README's too)."""
    text = (ROOT / "docs" / "sweeps.md").read_text()
    (line,) = [line for line in text.splitlines() if line.startswith("python train.py -m ") and "# 4 jobs" in line]
    assert "docs/tensorboard_hparams.png" in (ROOT / "README.md").read_text() and "tensorboard_hparams.png" in text
    return line.split("#")[0].split()[3:]


# The HParams tab of the documented sweep, as docs/tensorboard_hparams.png shows it: the columns ticked
# (TensorBoard ticks the first five hyperparameters, those that differ first, by name; and the first
# five metrics), and those it lists as differing.
SCREENSHOT_TICKED = ["flops_per_sample", "model", "model_mb", "optimizer", "optimizer.lr"]
SCREENSHOT_METRICS = [
    "final val acc",
    "best val acc",
    "final val loss",
    "samples/s (median of epochs 2+)",
    "training time (s)",
]
SCREENSHOT_DIFFER = [
    *SCREENSHOT_TICKED,
    "optimizer.momentum",
    "optimizer.nesterov",
    "optimizer.weight_decay",
    "parameters",
    "trainable_parameters",
]


@pytest.fixture(scope="module")
def model_optimizer_sweep(tmp_path_factory) -> tuple[Path, list[str], str]:
    """The documented sweep, each job 2 short epochs logged every 2 steps, to TensorBoard and CSV."""
    sweep = tmp_path_factory.mktemp("sweep") / "models"
    tiny = (*TINY[:1], "trainer.epochs=2", *TINY[2:], "trainer.log_every_n_steps=2", "logger=[tensorboard,csv]")
    return sweep, *_sweep_and_report(sweep, *documented_sweep(), tiny=tiny)


def _experiment_and_rows(sweep: Path) -> tuple[Any, dict[str, Any]]:
    """The sweep's HParams experiment (one of its jobs', as TensorBoard reads it) and each job's session start."""
    runs = EventMultiplexer().AddRunsFromDirectory(str(sweep))
    runs.Reload()
    data = plugin_data_pb2.HParamsPluginData.FromString
    tags = runs.PluginRunToTagToContent("hparams")
    experiments = {data(t["_hparams_/experiment"]).experiment.SerializeToString() for t in tags.values()}
    assert len(experiments) == 1  # every job writes the same: whichever TensorBoard reads is right
    experiment = data(next(iter(tags.values()))["_hparams_/experiment"]).experiment
    return experiment, {
        run: data(t["_hparams_/session_start_info"]).session_start_info for run, t in sorted(tags.items())
    }


@pytest.mark.slow
def test_a_model_and_optimizer_sweep_reports_what_its_jobs_used_that_differs_without_speedups(model_optimizer_sweep):
    sweep, (header, _, *lines), _ = model_optimizer_sweep
    columns = header.strip("| ").split(" | ")
    # weight_decay differs by each optimizer's defaults, the model's size by the model: nothing on the command line says so.
    assert columns[:9] == [
        "optimizer",
        "optimizer.lr",
        "optimizer.momentum",
        "optimizer.weight_decay",
        "optimizer.nesterov",
        "parameters",
        "trainable_parameters",
        "model_mb",
        "flops_per_sample",
    ]
    assert f"{HPARAM_METRICS['throughput/median_samples_per_s']}" in columns  # one samples/s, one title
    cells = [dict(zip(columns, line.strip("| ").split(" | "))) for line in lines]
    assert [
        (c["model"], c["optimizer"], c["optimizer.weight_decay"], c["parameters"], c["flops_per_sample"]) for c in cells
    ] == [
        ("simple_cnn", "sgd", "0.0005", "21386", "133200"),
        ("simple_cnn", "adamw", "0.01", "21386", "133200"),
        ("mnist_net", "sgd", "0.0005", "53002", "678656"),
        ("mnist_net", "adamw", "0.01", "53002", "678656"),
    ]
    assert all((c["speed-up"], c["efficiency"]) == ("—", "—") for c in cells)  # nothing to compare
    runs = report.load_runs(sweep)
    assert [report.used(r, "scheduler") for r in runs] == ["cosine"] * 4  # what each used where it overrode nothing


@pytest.mark.slow
def test_tensorboard_shows_what_the_sweeps_jobs_differ_in_as_numbers_each_row_named_by_its_sweep(model_optimizer_sweep):
    sweep, _, _ = model_optimizer_sweep
    experiment, rows = _experiment_and_rows(sweep)
    infos = {info.name: info for info in experiment.hparam_infos}
    # As the HParams tab lists them: those that differ first, by name (TensorBoard's order), the first five ticked.
    listed = sorted(infos, key=lambda name: (not infos[name].differs, name))
    assert listed[:5] == SCREENSHOT_TICKED and [name for name in listed if infos[name].differs] == SCREENSHOT_DIFFER
    assert [m.display_name for m in experiment.metric_infos][:5] == SCREENSHOT_METRICS
    assert "trainer.epochs" in infos and not infos["trainer.epochs"].differs  # given to every job alike
    assert api_pb2.DataType.Name(infos["optimizer.weight_decay"].type) == "DATA_TYPE_FLOAT64"  # sorted as a number
    values = {run: {k: json_format.MessageToDict(v) for k, v in start.hparams.items()} for run, start in rows.items()}
    assert [
        (
            v["model"],
            v["optimizer"],
            v["optimizer.weight_decay"],
            v["parameters"],
            v["flops_per_sample"],
            v["trainer.epochs"],
        )
        for v in values.values()
    ] == [
        ("simple_cnn", "sgd", 0.0005, 21386, 133200, 2),
        ("simple_cnn", "adamw", 0.01, 21386, 133200, 2),
        ("mnist_net", "sgd", 0.0005, 53002, 678656, 2),
        ("mnist_net", "adamw", 0.01, 53002, 678656, 2),
    ]
    assert [start.group_name for start in rows.values()] == [  # the Trial IDs
        f"model={m} optimizer={o} · {sweep.parent.name}/models #{i}"
        for i, (m, o) in enumerate(
            [("simple_cnn", "sgd"), ("simple_cnn", "adamw"), ("mnist_net", "sgd"), ("mnist_net", "adamw")]
        )
    ]


@pytest.mark.slow
def test_train_loss_is_the_epochs_in_the_log_tensorboard_the_csv_and_metrics_json(model_optimizer_sweep):
    sweep, _, _ = model_optimizer_sweep
    for job in sorted(p for p in sweep.iterdir() if (p / "tb").is_dir()):
        log = re.findall(r"epoch \d/2  train loss (\d\.\d{4}) acc (\d\.\d{4})", (job / "train.log").read_text())
        events = EventAccumulator(str(job / "tb"))
        events.Reload()
        tensorboard = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in ("train/loss", "train/acc")}
        with (job / "metrics.csv").open() as f:
            csv_rows = [row for row in csv.DictReader(f) if row["train/loss"]]
        metrics = json.loads((job / "metrics.json").read_text())
        # Each epoch's figure, at its last step (3 batches an epoch), in every one of them.
        assert [step for step, _ in tensorboard["train/loss"]] == [int(row["step"]) for row in csv_rows] == [3, 6]
        for (loss, acc), (_, tb_loss), (_, tb_acc), row in zip(
            log, tensorboard["train/loss"], tensorboard["train/acc"], csv_rows
        ):
            assert float(loss) == pytest.approx(tb_loss, abs=5e-5) == pytest.approx(float(row["train/loss"]), abs=5e-5)
            assert float(acc) == pytest.approx(tb_acc, abs=5e-5) == pytest.approx(float(row["train/acc"]), abs=5e-5)
        assert float(csv_rows[-1]["train/loss"]) == metrics["train_loss"] and len(log) == 2
        # The mean since the last log point has a name of its own, and its points only the documented cadence.
        assert (
            [e.step for e in events.Scalars("train/loss_window")] == [e.step for e in events.Scalars("lr")] == [2, 4, 6]
        )


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
    # Each job says its own dir, as it starts and as it ends.
    said = [line.split("run dir: ", 1)[1] for line in printed.splitlines() if "[train][INFO] - run dir: " in line]
    jobs = sorted(p for p in sweep.iterdir() if (p / "tb").is_dir())
    assert said == [text for job in jobs for text in (f"{job}", f"{job} (the run has ended)")]

"""bench.report: speed-up and efficiency against the right baseline, from whatever metrics.json holds."""
from __future__ import annotations

import json

import pytest

from bench import report


def _write(root, name, **metrics):
    run = root / name
    run.mkdir(parents=True)
    base = {"val_acc": 0.9, "best_val_acc": 0.95, "wall_s": 10.0, "model": "m", "dataset": "d", "batch_size": 64}
    (run / "metrics.json").write_text(json.dumps({**base, **metrics}) + "\n")


def _run(name="r", strategy="ddp", devices=1, batch_size=64, samples_per_s=100.0):
    return report.Run(name, strategy, devices, "m", "d", batch_size, samples_per_s, 0.9, 0.95, 10.0, None)


def test_speedup_is_the_throughput_ratio_and_efficiency_its_share_of_ideal():
    assert report.scaling(300.0, 4, 100.0) == pytest.approx((3.0, 0.75))
    assert report.scaling(50.0, 1, 100.0) == pytest.approx((0.5, 0.5))


def test_baseline_is_the_one_device_run_of_the_same_workload_and_strategy_first():
    single, dp1, ddp1 = _run("s", "single"), _run("dp1", "dp"), _run("ddp1", "ddp")
    ddp4, other_batch = _run("ddp4", "ddp", devices=4), _run("b128", "single", batch_size=128)
    runs = [single, dp1, ddp1, ddp4, other_batch]
    assert report.baseline(ddp4, runs) is ddp1
    assert report.baseline(_run("dp2", "dp", devices=2), runs) is dp1
    assert report.baseline(_run("x4", "fsdp", devices=4), runs) is single  # no fsdp on 1 device: another 1-device run
    assert report.baseline(_run("b32", devices=2, batch_size=32), runs) is None


def test_rows_compute_speedup_per_workload(tmp_path):
    _write(tmp_path, "0", strategy="ddp", devices=1, world_size=1, train_samples_per_s=100.0)
    _write(tmp_path, "1", strategy="ddp", devices=2, world_size=2, train_samples_per_s=180.0)
    _write(tmp_path, "2", strategy="ddp", devices=2, world_size=2, train_samples_per_s=90.0, batch_size=32)
    rows = {row.run.name: row for row in report.rows(report.load_runs(tmp_path))}
    assert (rows["0"].speedup, rows["0"].efficiency) == pytest.approx((1.0, 1.0))
    assert (rows["1"].speedup, rows["1"].efficiency) == pytest.approx((1.8, 0.9))
    assert (rows["2"].speedup, rows["2"].efficiency) == (None, None)


def test_old_and_new_metrics_files_both_load(tmp_path):
    # Before devices/batch_size were recorded: devices from world_size, batch unknown.
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "metrics.json").write_text(json.dumps(
        {"val_acc": 0.5, "best_val_acc": 0.6, "train_samples_per_s": 10.0, "wall_s": 3.0, "world_size": 2,
         "strategy": "ddp", "model": "m", "dataset": "d", "epochs": 1, "steps": 5}))
    _write(tmp_path, "new", strategy="dp", devices=4, world_size=1, train_samples_per_s=1.0, peak_memory_mb=[900, 1200])
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "metrics.json").write_text('{"val_acc": 0.5}')
    runs = {run.name: run for run in report.load_runs(tmp_path)}
    assert sorted(runs) == ["new", "old"]
    assert (runs["old"].devices, runs["old"].batch_size, runs["old"].peak_memory_mb) == (2, None, None)
    assert (runs["new"].devices, runs["new"].batch_size, runs["new"].peak_memory_mb) == (4, 64, 1200)


def test_markdown_shows_a_dash_where_there_is_no_figure():
    table = report.markdown([report.Row(_run("0", devices=2, samples_per_s=1234.0), None, None),
                             report.Row(_run("1"), 1.0, 1.0)])
    header, _, no_baseline, baseline = table.splitlines()
    assert header.count("|") == no_baseline.count("|") == 13
    assert "| 2 | m | d | 64 | 1,234 | — | — | 90.00% | 95.00% | — | 0 |" in no_baseline
    assert "| 1.00× | 100% |" in baseline


def test_main_prints_the_table_and_writes_the_plot(tmp_path, capsys):
    _write(tmp_path, "0", strategy="ddp", devices=1, train_samples_per_s=100.0)
    _write(tmp_path, "1", strategy="ddp", devices=2, train_samples_per_s=150.0)
    assert report.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| 1.50× | 75% |" in out
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_main_without_runs_says_what_to_do(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    assert "no metrics.json under" in capsys.readouterr().err
    assert not (tmp_path / "report.png").exists()

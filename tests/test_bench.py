"""Every benchmark runs end to end at a tiny size and prints a consistent table (no timing asserts)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bench.common import FORKSERVER_RANKS
from config.setup import ROOT
from tests import train_server
from tests.runs import run_train

LIGHTNING = importlib.util.find_spec("lightning") is not None  # bench-only: requirements-bench.txt


def bench(name: str, *args: str) -> list[dict[str, str]]:
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", *args], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return table_rows(done.stdout)


def bench_here(name: str, *args: str, monkeypatch, capsys) -> list[dict[str, str]]:
    """bench.<name> in this process, each of its train.py runs, and its baseline script's, forked
    from the train server (as run_train's are): for the benchmarks whose figures a run reports
    (bytes, steady-state samples/s), not its start-up, which those run by `bench` pay for. The
    runs' ranks fork from them too, where the benchmark's forkserver would import everything once more."""
    module = importlib.import_module(f"bench.{name}")

    def train(*overrides: str) -> dict:
        with tempfile.TemporaryDirectory() as run_dir:
            done = run_train(Path(run_dir), *(o for o in overrides if o != FORKSERVER_RANKS))
            assert done.returncode == 0, done.stderr[-2000:]
            return json.loads((Path(run_dir) / "metrics.json").read_text())

    def python_json(flag: str, module: str, *args: str) -> dict:
        assert flag == "-m", "bench.common.python_json runs a baseline module: python -m bench.<module> ..."
        done = train_server.run(list(args), module=module)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    monkeypatch.setattr(module, "train", train)
    if hasattr(module, "python_json"):
        monkeypatch.setattr(module, "python_json", python_json)
    monkeypatch.setattr(sys, "argv", [f"bench.{name}", *args])
    module.main()
    return table_rows(capsys.readouterr().out)


def table_rows(out: str) -> list[dict[str, str]]:
    lines = [line for line in out.splitlines() if line.startswith("|")]
    headers = [h.strip() for h in lines[0].strip("|").split("|")]
    return [dict(zip(headers, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


def number(cell: str) -> float:
    return float(cell.replace(",", ""))


def is_ratio(ratio: str, over: str, under: str) -> bool:
    """Whether the printed `ratio` is `over / under` as far as the printed cells show them: each is
    its figure rounded to its last printed digit (a small figure's rounding alone can move a ratio
    by more than a fixed tolerance)."""
    (r, dr), (a, da), (b, db) = (_printed(cell) for cell in (ratio, over, under))
    if b - db <= 0 <= b + db:  # the divisor could be 0: any ratio
        return True
    bounds = [(a + i * da) / (b + j * db) for i in (-1, 1) for j in (-1, 1)]
    return min(bounds) - dr <= r <= max(bounds) + dr


def _printed(cell: str) -> tuple[float, float]:
    """A printed figure and half a unit of its last digit."""
    text = cell.replace(",", "")
    return float(text), 0.5 * 10 ** -len(text.partition(".")[2])


@pytest.mark.slow
def test_overhead_ratio_is_ours_over_plain(monkeypatch, capsys):
    rows = bench_here("overhead", "--quick", monkeypatch=monkeypatch, capsys=capsys)
    assert [r["case"] for r in rows] == ["simple_cnn 3x32x32"]  # --quick: the first case only
    for row in rows:
        ours, plain = row["train.py samples/s (median)"], row["plain loop samples/s (median)"]
        assert number(ours) > 0 and number(plain) > 0
        # one round: the median of per-round ratios is that round's ratio
        assert is_ratio(row["ratio (median of per-round ratios)"], ours, plain), row


@pytest.mark.slow
def test_ddp_says_it_compares_two_ways_to_use_the_same_cores(monkeypatch, capsys):
    (row,) = bench_here("ddp", "--quick", "--batch-size", "32", monkeypatch=monkeypatch, capsys=capsys)
    single = next(v for k, v in row.items() if k.startswith("1 process x "))
    ddp = next(v for k, v in row.items() if k.startswith("ddp: 2 processes x "))
    assert is_ratio(row["ratio (median of per-round ratios)"], ddp, single), row


@pytest.mark.slow
def test_startup_clocks_each_command_to_its_first_optimizer_step():
    rows = bench("startup", "--quick")
    commands = [r["command"] for r in rows]
    assert commands[2:4] == [
        "python train.py (default job), to its first optimizer step",
        "python train.py (peers job), to its first optimizer step",
    ]
    if LIGHTNING:
        assert commands[4:] == ["Lightning Trainer (peers job), to its first optimizer step"]
    bare = number(rows[0]["seconds (median)"])
    assert bare > 0
    for row in rows[1:]:
        assert number(row["seconds (median)"]) > 0
        assert number(row["above bare import (s)"]) == pytest.approx(number(row["seconds (median)"]) - bare, abs=0.002)
    assert rows[2]["target ≤ 2.0 s above"] in ("meets target", "MISSES target")


@pytest.mark.slow
def test_peers_times_train_py_lightning_and_the_hand_written_loop_side_by_side():
    """With Lightning installed (make bench-deps) all three; else train.py and the loop only."""
    rows = bench("peers", "--quick", *([] if LIGHTNING else ["--no-lightning"]))
    programs = (
        ["train.py", "Lightning", "hand-written loop", "train.py / Lightning"]
        if LIGHTNING
        else ["train.py", "hand-written loop"]
    )
    assert [r["program"] for r in rows] == programs
    assert {r["case"] for r in rows} == {"simple_cnn 3x32x32, batch 128"}  # --quick: the first case only
    by = {r["program"]: r for r in rows}
    speed = {name: by[name]["samples/s (median)"] for name in programs if "/" not in name}
    startup = {name: by[name]["start-up + 2 steps (s)"] for name in speed}
    vs_loop = "/ hand-written loop (median of rounds)"
    assert number(by["hand-written loop"][vs_loop]) == 1
    # One round: each ratio is that round's ratio of the figures printed (a --quick round's figures
    # mean nothing, and a loaded machine can even make one negative).
    assert is_ratio(by["train.py"][vs_loop], speed["train.py"], speed["hand-written loop"])
    # ...and the range of one round's ratios is that ratio alone (the range always to 3 decimals, a
    # ratio of 100 or more without them: a 2-step difference of walls can be next to nothing).
    spread = "range of the rounds' throughput ratios"

    def alone(row: dict[str, str], ratio: str) -> bool:
        low, high = row[spread].split("–")
        return number(low) == number(high) == pytest.approx(number(row[ratio]), rel=0.01, abs=5e-4)

    assert [r for r in rows if "/" not in r["program"] and not alone(r, vs_loop)] == []
    assert all(number(seconds) > 0 for seconds in startup.values())
    if LIGHTNING:
        ratio = by["train.py / Lightning"]
        assert is_ratio(ratio["samples/s (median)"], speed["train.py"], speed["Lightning"])
        assert alone(ratio, "samples/s (median)"), ratio
        assert is_ratio(ratio["start-up + 2 steps (s)"], startup["train.py"], startup["Lightning"])


def test_peers_without_lightning_says_how_to_get_it_and_exits_2():
    # -S: no site-packages, so no Lightning; bench.peers must say so before it imports anything else.
    done = subprocess.run(
        [sys.executable, "-S", "-m", "bench.peers", "--quick"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    assert (
        done.stderr.strip()
        == "bench.peers needs Lightning: make bench-deps (pip install -r requirements-bench.txt into .venv)"
    )


@pytest.mark.slow
def test_time_to_accuracy_trains_ours_and_the_baseline():
    ours, plain, ratio = bench("time_to_accuracy", "--quick", "logger=none")
    assert [ours["job"], plain["job"]] == ["python train.py logger=none", "bench/plain_digits.py (baseline)"]
    for row in (ours, plain):
        assert 0.1 < number(row["final val acc (median of seeds)"]) <= 1.0  # one epoch: well above chance (0.1)
    # One round: the median of the per-round ratios is that round's ratio.
    assert is_ratio(ratio["wall (s)"], ours["wall (s)"], plain["wall (s)"])


@pytest.mark.slow
def test_data_loaders_ratios_are_each_batched_loader_over_the_per_sample_one(monkeypatch, capsys):
    # In this process (torch imported already): it times loaders it builds, not its own start-up.
    monkeypatch.setattr(sys, "argv", ["bench.data_loaders", "--quick", "data.num_workers=1"])
    importlib.import_module("bench.data_loaders").main()
    rows = table_rows(capsys.readouterr().out)
    assert [r["samples/s"] for r in rows] == ["loader", "training"]
    for row in rows:
        per_sample, host, device = (row[k] for k in ("per-sample", "data.loader=dataloader", "data.loader=device"))
        assert number(per_sample) > 0 and number(host) > 0 and number(device) > 0
        assert is_ratio(row["host batches / per-sample"], host, per_sample), row
        assert is_ratio(row["device batches / per-sample"], device, per_sample), row


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="on a GPU this is the real benchmark, not a smoke run"
)
@pytest.mark.parametrize("name", ["gpu", "gpu_profile"])
def test_gpu_benchmarks_skip_cleanly_without_cuda(name, monkeypatch, capsys):
    # In this process: main() returning is `python -m bench.<name>` exiting 0.
    monkeypatch.setattr(sys, "argv", [f"bench.{name}"])
    importlib.import_module(f"bench.{name}").main()
    assert capsys.readouterr().out == f"bench.{name}: skipped, no CUDA device visible\n"


@pytest.mark.slow
def test_memory_shows_an_fsdp_rank_holding_half_of_a_ddp_rank(monkeypatch, capsys):
    # --quick: ddp(2) and fsdp(2)
    ddp, fsdp = bench_here("memory", "--quick", monkeypatch=monkeypatch, capsys=capsys)
    for column in ("params MB/rank", "grads MB/rank", "optimizer MB/rank", "total MB/rank"):
        assert number(fsdp[column]) == pytest.approx(number(ddp[column]) / 2, rel=0.01), column
    assert number(fsdp["× ddp"]) == pytest.approx(0.5, abs=0.01) and fsdp["target ≤ 1.05 × ideal"] == "meets target"


@pytest.mark.slow
def test_fsdp_ratio_is_fsdp_over_ddp(monkeypatch, capsys):
    # --quick: ddp(2) and fsdp(2); ZeRO-2 is fsdp(2) with one option more
    ddp, fsdp = bench_here("fsdp", "--quick", "--batch-size", "16", monkeypatch=monkeypatch, capsys=capsys)
    assert (ddp["system"], fsdp["system"]) == ("ddp(2)", "fsdp(2)")
    assert number(ddp["ratio to ddp(2) (median of pairs)"]) == 1
    # One repeat: the median ratio is the ratio of the medians.
    assert is_ratio(fsdp["ratio to ddp(2) (median of pairs)"], fsdp["samples/s (median)"], ddp["samples/s (median)"])


@pytest.mark.slow
def test_imagefolder_prints_each_path_against_todays_and_the_cut_against_roi_align(monkeypatch, capsys):
    # In this process (torch imported already): --quick writes 16 small JPEGs and runs one round.
    monkeypatch.setattr(sys, "argv", ["bench.imagefolder", "--quick"])
    importlib.import_module("bench.imagefolder").main()
    out = capsys.readouterr().out
    loaders, decode, cuts = (table_rows(block) for block in out.split("\n\n") if "\n|" in "\n" + block)
    by_name = {row[next(iter(row))]: row for row in loaders}
    assert number(by_name["today, per core"]["× today"]) == 1.0
    target = by_name[f"data.decode=cpu, {len(__import__('os').sched_getaffinity(0))} workers"]["target"]
    assert target.startswith("≥ 1.5×: ") and target.endswith("target")
    assert [row["decode alone (PIL), per core"] for row in decode] == [
        "original",
        "data.prepare --max-side 500 --quality 90",
        "data.prepare --max-side 400 --quality 90",
    ]
    assert len(cuts) == 4 and all(row["device"] == "cpu" for row in cuts)
    assert "no CUDA device" in out


@pytest.mark.slow
def test_checkpoint_stall_times_the_steps_with_and_without_fsdp_saves(monkeypatch, capsys):
    module = importlib.import_module("bench.checkpoint_stall")
    monkeypatch.setattr(module, "START_METHOD", "fork")  # ranks forked from this process: torch is imported
    monkeypatch.setattr(sys, "argv", ["bench.checkpoint_stall", "--quick"])
    module.main()
    (row,) = table_rows(capsys.readouterr().out)
    assert (row["model"], row["rounds"]) == ("simple_cnn", "1 x 1 saves")  # --quick: one save after one step
    step, save = number(row["step s"]), number(row["s a save adds"])
    assert step > 0
    # One round: each median is that round's figure, and a ratio of two printed ones, each to 3
    # decimals (a --quick round's figures mean nothing; a loaded machine can even make a save's negative).
    ratio = number(row["save / step"])
    assert ratio * step == pytest.approx(save, abs=5e-4 * (1 + step + abs(ratio)))
    share, low, high = re.fullmatch(r"(\S+) \((\S+)–(\S+)\)", row["saves' share at every 1 steps"]).groups()
    assert share == low == high and number(share) * (step + save) == pytest.approx(
        save, abs=5e-4 * (2 + abs(number(share)))
    )

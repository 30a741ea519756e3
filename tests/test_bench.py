"""Every benchmark runs end to end at a tiny size and prints a consistent table (no timing asserts)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT


def bench(name: str, *args: str) -> list[dict[str, str]]:
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", *args], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("|")]
    headers = [h.strip() for h in lines[0].strip("|").split("|")]
    return [dict(zip(headers, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


def number(cell: str) -> float:
    return float(cell.replace(",", ""))


def test_overhead_ratio_is_ours_over_plain():
    rows = bench("overhead", "--quick")
    assert [r["case"] for r in rows] == ["simple_cnn 3x32x32"]  # --quick: the first case only
    for row in rows:
        ours, plain = number(row["train.py samples/s"]), number(row["plain loop samples/s"])
        assert ours > 0 and plain > 0
        assert number(row["ratio"]) == pytest.approx(ours / plain, rel=0.01)


def test_ddp_ratio_is_ddp_over_single():
    (row,) = bench("ddp", "--quick")
    single, ddp = number(row["single samples/s"]), number(row["ddp(2, gloo) samples/s"])
    assert number(row["ratio"]) == pytest.approx(ddp / single, rel=0.01)


def test_startup_reports_seconds_above_bare_import():
    bare, optimizer, ours = bench("startup", "--quick")
    assert number(ours["seconds (median)"]) > number(bare["seconds (median)"]) > 0
    assert number(ours["above bare import (s)"]) == pytest.approx(
        number(ours["seconds (median)"]) - number(bare["seconds (median)"]), abs=0.002
    )


def test_time_to_accuracy_trains_ours_and_the_baseline():
    ours, plain, ratio = bench("time_to_accuracy", "--quick")
    for row in (ours, plain):
        assert 0.1 < number(row["final val acc (median)"]) <= 1.0  # one epoch: well above chance (0.1)
    assert number(ratio["wall (s)"]) == pytest.approx(number(ours["wall (s)"]) / number(plain["wall (s)"]), rel=0.01)


def test_data_loaders_ratio_is_device_over_dataloader():
    rows = bench("data_loaders", "--quick", "data.num_workers=1")
    assert [r["samples/s"] for r in rows] == ["loader", "training"]
    for row in rows:
        dataloader, device = number(row["data.loader=dataloader"]), number(row["data.loader=device"])
        assert dataloader > 0 and device > 0
        assert number(row["ratio"]) == pytest.approx(device / dataloader, rel=0.01)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="on a GPU this is the real benchmark, not a smoke run")
def test_gpu_benchmark_skips_cleanly_without_cuda():
    done = subprocess.run([sys.executable, "-m", "bench.gpu", "--quick"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0 and "skipped, no CUDA" in done.stdout, done.stderr


@pytest.mark.slow
def test_memory_shows_an_fsdp_rank_holding_half_of_a_ddp_rank():
    ddp, fsdp = bench("memory", "--quick")  # --quick: ddp(2) and fsdp(2)
    for column in ("params MB/rank", "grads MB/rank", "optimizer MB/rank", "total MB/rank"):
        assert number(fsdp[column]) == pytest.approx(number(ddp[column]) / 2, rel=0.01), column
    assert number(fsdp["× ddp"]) == pytest.approx(0.5, abs=0.01) and fsdp["target ≤ 1.05 × ideal"] == "meets target"


@pytest.mark.slow
def test_fsdp_ratio_is_fsdp_over_ddp():
    ddp, fsdp, zero2 = bench("fsdp", "--quick")
    assert number(ddp["ratio to ddp(2) (median of pairs)"]) == 1
    for row in (fsdp, zero2):  # one repeat: the median ratio is the ratio of the medians
        ratio = number(row["samples/s (median)"]) / number(ddp["samples/s (median)"])
        assert number(row["ratio to ddp(2) (median of pairs)"]) == pytest.approx(ratio, rel=0.01)

"""training.profiling: the trace Perfetto opens and the table of top operators (trainer.profile's and
bench.gpu_profile's one code path)."""
from __future__ import annotations

import json
import logging

import pytest
import torch

from training.profiling import profile_steps


def linear_step(device: torch.device):
    net = torch.nn.Linear(16, 4, device=device)
    x = torch.randn(8, 16, device=device)
    return lambda: net(x).sum().backward()


def test_the_recorded_steps_come_after_the_warm_up_as_a_chrome_trace_and_a_table(tmp_path, caplog):
    trace = tmp_path / "profile" / "trace.json"
    with caplog.at_level(logging.INFO, logger="train"):
        profiler = profile_steps(linear_step(torch.device("cpu")), 2, torch.device("cpu"), trace, wait=1, warmup=1)
    events = json.loads(trace.read_text())["traceEvents"]  # the Chrome trace format, as Perfetto reads it
    steps = sorted(e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#2", "ProfilerStep#3"]  # steps 0 (wait) and 1 (warm-up) not recorded
    assert any(e.get("name") == "aten::addmm" and e.get("ph") == "X" for e in events)
    assert "aten::addmm" in profiler.table and "Self CPU" in profiler.table
    assert profiler.table in caplog.text and str(trace) in caplog.text


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA kernels and memory need a GPU")
def test_on_cuda_the_trace_holds_kernels_and_memory_and_the_table_sorts_by_device_time(tmp_path):
    device = torch.device("cuda", 0)
    trace = tmp_path / "trace.json"
    profiler = profile_steps(linear_step(device), 2, device, trace, wait=1, warmup=1)
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in events) and any(e.get("name") == "[memory]" for e in events)
    assert "Self CUDA" in profiler.table and "CUDA Mem" in profiler.table

"""training.profiling on CUDA: the trace Perfetto opens and the table of top operators (trainer.profile's
and bench.gpu_profile's one code path; on CPU, tests/test_loggers.py reads what trainer.profile wrote)."""

from __future__ import annotations

import json

import pytest
import torch

from training.profiling import profile_steps


def linear_step(device: torch.device):
    net = torch.nn.Linear(16, 4, device=device)
    x = torch.randn(8, 16, device=device)
    return lambda: net(x).sum().backward()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA kernels and memory need a GPU")
def test_on_cuda_the_trace_holds_kernels_and_memory_and_the_table_sorts_by_device_time(tmp_path):
    device = torch.device("cuda", 0)
    trace = tmp_path / "trace.json"
    profiler = profile_steps(linear_step(device), 2, device, trace, wait=1, warmup=1)
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in events) and any(e.get("name") == "[memory]" for e in events)
    assert "Self CUDA" in profiler.table and "CUDA Mem" in profiler.table

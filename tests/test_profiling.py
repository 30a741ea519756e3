"""training.profiling on CUDA: the trace Perfetto opens and the table of top operators (trainer.profile's
and bench.gpu_profile's one code path; on CPU, tests/test_loggers.py reads what trainer.profile wrote);
and where the profiler's libraries' own lines go (trainer.profile's, on CPU: tests/test_loggers.py)."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch

from training.profiling import HeldStderr, profile_steps


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


def test_the_profilers_own_lines_go_to_the_log_file_and_the_rest_of_stderr_stays(tmp_path, capfd):
    log_file = logging.FileHandler(tmp_path / "train.log")  # as rank 0's logging has it
    logging.getLogger().addHandler(log_file)
    try:
        held = HeldStderr()
        for line in (  # as kineto and c10 write them, from C++
            b"USDT:2026-12-06 04:41:16 23677:23677 SyncActivityProfilerHandler.cpp:39] profiler_start\n",
            b"[W1206 04:41:16.102447670 CPUAllocator.cpp:245] Memory block of unknown size was allocated before\n",
            b"a warning of the run's own\n",
        ):
            os.write(2, line)
        held.release()
    finally:
        logging.getLogger().removeHandler(log_file)
        log_file.close()
    assert capfd.readouterr().err == "a warning of the run's own\n"
    logged = (tmp_path / "train.log").read_text()
    assert "] profiler_start" in logged and "Memory block of unknown size" in logged and "run's own" not in logged

"""Where a GPU training step's time goes, CUDA only (elsewhere it says so and exits 0).

python -m bench.gpu_profile [--steps 20] [--only REGEX] [--trace-dir DIR]

bench.gpu's job, one step at a time (ResNet-50, 128 CIFAR-shaped images, bf16 autocast, channels
last, SGD): eager, and compiled with CUDA graphs (also with SGD's fused kernel); then under DDP
at world size 1 over NCCL (wrapped as train.py does: compiled inside, gradients as bucket views),
with the views zeroed or freed between steps, with and without the per-forward buffer broadcast
(strategy.forward_sync_buffers), and with compiled autograd taking DDP's reducer into the trace.
For each: the wall time per step against the time the GPU spends in kernels per step
(torch.profiler, run as trainer.profile runs it: training.profiling), and the kernels launched per
step. A wall time well above the GPU's: the CPU launching kernels sets the pace, not the GPU running
them. Then the CPU operators whose time DDP adds to the eager step, and the CPU operators and GPU
kernels whose time it adds to the graphed step without the buffer broadcast. --trace-dir writes
each setup's trace, for Perfetto (ui.perfetto.dev) or chrome://tracing.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
from torch.autograd import DeviceType
from torch.nn.parallel import DistributedDataParallel

from bench.common import table
from distributed.strategies import SYNC_BUFFERS_ARG
from training.profiling import profile_steps


@dataclass(frozen=True)
class Setup:
    name: str
    mode: str | None = None  # torch.compile's, None: eager
    ddp: bool = False
    forward_sync_buffers: bool = True
    fused: bool = False  # SGD's fused CUDA kernel in place of its foreach default
    zeroed: bool = False  # zero_grad zeroes DDP's bucket views in place of freeing the gradients
    compiled_autograd: bool = False  # the backward traced and compiled too, DDP's reducer hooks with it


GRAPHED = "reduce-overhead"
SETUPS = [
    Setup("eager"),
    Setup("compiled + CUDA graphs", GRAPHED),
    Setup("compiled + CUDA graphs, fused SGD", GRAPHED, fused=True),
    Setup("DDP eager, bucket views zeroed", ddp=True, zeroed=True),
    Setup("DDP eager", ddp=True),
    Setup("DDP eager, forward_sync_buffers=False", ddp=True, forward_sync_buffers=False),
    Setup("DDP compiled + CUDA graphs, bucket views zeroed", GRAPHED, ddp=True, zeroed=True),
    Setup("DDP compiled + CUDA graphs", GRAPHED, ddp=True),
    Setup("DDP compiled + CUDA graphs, forward_sync_buffers=False", GRAPHED, ddp=True, forward_sync_buffers=False),
    Setup(
        "DDP compiled + CUDA graphs, forward_sync_buffers=False, fused SGD",
        GRAPHED,
        ddp=True,
        forward_sync_buffers=False,
        fused=True,
    ),
    Setup(
        "DDP compiled + CUDA graphs, forward_sync_buffers=False, compiled autograd",
        GRAPHED,
        ddp=True,
        forward_sync_buffers=False,
        compiled_autograd=True,
    ),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="steps timed, and steps profiled")
    parser.add_argument("--only", default="", help="the setups whose name this regular expression matches")
    parser.add_argument("--trace-dir", type=Path, help="a dir to write each setup's trace to")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench.gpu_profile: skipped, no CUDA device visible")
        return
    torch.backends.cudnn.benchmark = True
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=torch.device("cuda", 0))
    rows, cpu_ms, gpu_ms = [], {}, {}
    for setup in [s for s in SETUPS if re.search(args.only, s.name)]:
        with dynamo_config(setup):
            trace = args.trace_dir / f"{re.sub('[^a-z0-9]+', '_', setup.name.lower())}.json" if args.trace_dir else None
            row, cpu_ms[setup.name], gpu_ms[setup.name] = measure(setup, args.steps, trace)
        rows.append(row)
    dist.destroy_process_group()
    print(f"device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; {args.steps} steps each\n")
    print(
        table(
            [
                "ResNet-50, batch 128, bf16, channels_last",
                "wall ms/step",
                "GPU kernel ms/step",
                "GPU busy",
                "kernels/step",
                "samples/s",
            ],
            rows,
        )
    )
    print_added("CPU operators DDP adds to the eager step (self time)", cpu_ms, "eager", "DDP eager")
    graphed_pair = ("compiled + CUDA graphs", "DDP compiled + CUDA graphs, forward_sync_buffers=False")
    print_added("CPU operators DDP adds to the graphed step (self time)", cpu_ms, *graphed_pair)
    print_added("GPU kernels DDP adds to the graphed step", gpu_ms, *graphed_pair)


def measure(setup: Setup, steps: int, trace: Path | None = None) -> tuple[list, dict[str, float], dict[str, float]]:
    """The setup's table row, and its CPU operators' and GPU kernels' ms per step."""
    step = training_step(setup)
    for _ in range(10):  # compiles, records the graphs, lets cuDNN pick its algorithms
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - start) * 1e3 / steps
    prof = profile_steps(step, steps, torch.device("cuda", 0), trace, wait=0).profiler  # warmed up above
    # GPU user annotations (DDP's "DistributedDataParallel.forward" range) are spans, not kernels
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA and not e.is_user_annotation]
    busy_ms = sum(e.time_range.elapsed_us() for e in kernels) / 1e3 / steps
    per_kernel: dict[str, float] = {}
    for e in kernels:
        per_kernel[e.name] = per_kernel.get(e.name, 0.0) + e.time_range.elapsed_us() / 1e3 / steps
    per_operator = {e.key: e.self_cpu_time_total / 1e3 / steps for e in prof.key_averages()}
    row = [setup.name, wall_ms, busy_ms, busy_ms / wall_ms, len(kernels) / steps, 128 / wall_ms * 1e3]
    return row, per_operator, per_kernel


def dynamo_config(setup: Setup) -> contextlib.AbstractContextManager:
    """Compiled autograd's DDP all-reduces from Python hooks that the trace takes in. DDP reads
    optimize_ddp when it is built, dynamo when it compiles: the whole setup runs under it."""
    if setup.compiled_autograd:
        return torch._dynamo.config.patch(optimize_ddp="python_reducer")
    return contextlib.nullcontext()


def print_added(title: str, ms_per_step: dict[str, dict[str, float]], base: str, under: str) -> None:
    """The dozen names (operators or kernels) whose time per step grows most from setup base to setup under."""
    if base not in ms_per_step or under not in ms_per_step:
        return
    ms = ms_per_step[under]
    added = sorted(((t - ms_per_step[base].get(name, 0.0), name) for name, t in ms.items()), reverse=True)[:12]
    print(f"\n{title} (profiled):\n")
    print(table(["name", "ms/step added", f"ms/step, {under}"], [[name[:90], t, ms[name]] for t, name in added]))


def training_step(setup: Setup):
    """A fresh model and optimizer; returns one training step on fixed random data."""
    net = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    model = net if setup.mode is None else torch.compile(net, mode=setup.mode)
    if setup.ddp:
        model = DistributedDataParallel(
            model, device_ids=[0], gradient_as_bucket_view=True, **{SYNC_BUFFERS_ARG: setup.forward_sync_buffers}
        )
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4, fused=setup.fused or None)
    x = torch.randn(128, 3, 32, 32, device="cuda").contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (128,), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        if setup.compiled_autograd:  # a private entry point, in torch 2.11 and 2.14 alike
            with torch._dynamo.compiled_autograd._enable(torch.compile(mode=setup.mode)):
                loss.backward()
        else:
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=not setup.zeroed)

    return step


if __name__ == "__main__":
    main()

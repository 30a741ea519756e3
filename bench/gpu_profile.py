"""Where a GPU training step's time goes, CUDA only (elsewhere it says so and exits 0).

python -m bench.gpu_profile [--steps 20]

bench.gpu's job, one step at a time (ResNet-50, 128 CIFAR-shaped images, bf16 autocast, channels
last, SGD), eager, compiled, and compiled with CUDA graphs: the wall time per step against the
time the GPU spends in kernels per step (torch.profiler), and the kernels launched per step. A
wall time well above the GPU's: the CPU launching kernels sets the pace, not the GPU running them.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
import torchvision
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from bench.common import table

MODES = {"eager": None, "compiled": "default", "compiled + CUDA graphs": "reduce-overhead"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="steps timed, and steps profiled")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench.gpu_profile: skipped, no CUDA device visible")
        return
    torch.backends.cudnn.benchmark = True
    rows = []
    for name, mode in MODES.items():
        step = training_step(mode)
        for _ in range(10):  # compiles, records the graphs, lets cuDNN pick its algorithms
            step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - start) * 1e3 / args.steps
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                step()
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
        busy_ms = sum(e.time_range.elapsed_us() for e in kernels) / 1e3 / args.steps
        rows.append([name, wall_ms, busy_ms, busy_ms / wall_ms, len(kernels) / args.steps, 128 / wall_ms * 1e3])
    print(f"device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; {args.steps} steps each\n")
    print(table(["ResNet-50, batch 128, bf16, channels_last", "wall ms/step", "GPU kernel ms/step", "GPU busy",
                 "kernels/step", "samples/s"], rows))


def training_step(mode: str | None):
    """A fresh model and optimizer; returns one training step on fixed random data."""
    net = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    model = net if mode is None else torch.compile(net, mode=mode)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    x = torch.randn(128, 3, 32, 32, device="cuda").contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (128,), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


if __name__ == "__main__":
    main()

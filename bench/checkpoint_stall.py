"""Does saving strategy=fsdp's sharded last.pt stall the steps measurably? FSDP(2) on the CPU.

python -m bench.checkpoint_stall [--quick] [--rounds 5] [--model resnet18] [--every 20] [--saves 2]

Two gloo ranks train `--model` (FSDP2, as strategy=fsdp shards it; SGD with momentum) on random
3x32x32 batches of 64 (32 a rank) and save through train.py's ShardedCheckpointer (every rank
writes its shards with DCP, all wait, rank 0 commits the directory) into a temporary checkpoints
directory. Each round times, in turns, `--saves` x (`--every` steps, then a save), and the same
steps without the saves. From each round: the seconds a step takes, the seconds a save adds, that
as a share of a step, and the saves' share of the time at that cadence; the medians of the rounds,
and the range of the share.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench.common import median, spread, table
from config.schema import StrategyConfig, StrategyName
from distributed import fsdp
from distributed.context import cpus_per_rank, make_context
from distributed.launch import end_process
from models.resnet import resnet
from models.simple_cnn import SimpleCNN
from training.checkpoint.sharded_checkpointer import ShardedCheckpointer
from training.checkpoint.state import TrainState

WORLD = 2
START_METHOD = "spawn"  # each rank a fresh interpreter, as train.py's launcher starts them
BATCH = 64  # global
MODELS = {
    "resnet18": lambda: resnet("resnet18", 3, 10),
    "resnet50": lambda: resnet("resnet50", 3, 10),
    "simple_cnn": lambda: SimpleCNN(3, 10, 32),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run; its figures mean nothing")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", default="resnet18", choices=list(MODELS))
    parser.add_argument("--every", type=int, default=20, help="steps between saves")
    parser.add_argument("--saves", type=int, default=2, help="saves per timed run")
    args = parser.parse_args()
    if args.quick:
        args.model, args.rounds, args.every, args.saves = "simple_cnn", 1, 1, 1
    with tempfile.TemporaryDirectory(prefix="checkpoint-stall-") as tmp:
        mp.start_processes(_rank, args=(Path(tmp), args, START_METHOD), nprocs=WORLD, start_method=START_METHOD)
        rounds = json.loads((Path(tmp) / "rounds.json").read_text())

    steps = args.saves * args.every
    step_s = [plain / steps for plain, _ in rounds]
    save_s = [(saving - plain) / args.saves for plain, saving in rounds]
    shares = [(saving - plain) / saving for plain, saving in rounds]
    print(
        table(
            ["model", "rounds", "step s", "s a save adds", "save / step", f"saves' share at every {args.every} steps"],
            [
                [
                    args.model,
                    f"{len(rounds)} x {args.saves} saves",
                    median(step_s),
                    median(save_s),
                    median([save / step for save, step in zip(save_s, step_s)]),
                    f"{median(shares):.3f} ({spread(shares)})",
                ]
            ],
        )
    )


def _rank(rank: int, tmp: Path, args: argparse.Namespace, start_method: str) -> None:
    torch.set_num_threads(cpus_per_rank(WORLD))
    ctx = make_context(rank, rank, WORLD, WORLD, "cpu", use_process_group=True)
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp / "store"), WORLD), rank=rank, world_size=WORLD)
    torch.manual_seed(rank)
    model = fsdp.shard(MODELS[args.model](), ctx, StrategyConfig(name=StrategyName.fsdp), None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(BATCH // WORLD, 3, 32, 32), torch.randint(0, 10, (BATCH // WORLD,))

    def step() -> None:
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()

    checkpointer = ShardedCheckpointer(ctx, tmp / "checkpoints", model, optimizer, None, "")
    state = TrainState()
    step()  # the optimizer's state exists, as at every save after the first step
    checkpointer.save(state)  # DCP's first save plans and allocates once
    rounds = []
    for _ in range(args.rounds):
        seconds = []
        for saving in (False, True):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(args.saves):
                for _ in range(args.every):
                    step()
                    state.step += 1
                if saving:
                    checkpointer.save(state)
            dist.barrier()  # the slower rank's time: every rank's steps wait for it
            seconds.append(time.perf_counter() - start)
        rounds.append(seconds)
    checkpointer.close()
    if ctx.is_main:
        (tmp / "rounds.json").write_text(json.dumps(rounds))
    dist.destroy_process_group()
    if start_method == "spawn":  # as train.py's spawned ranks leave (a gloo thread may outlive the group)
        end_process(0)


if __name__ == "__main__":
    main()

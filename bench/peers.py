"""train.py, PyTorch Lightning and a hand-written loop on the same job, side by side.

python -m bench.peers [--quick] [--rounds 5] [--no-lightning]

The job: simple_cnn on random 3x32x32 images (2,048 train, 512 validation) at batch 128, and
mnist_net on 1x28x28 at batch 64; SGD lr 0.05, momentum 0.9 (conf/optimizer/sgd.yaml: also
weight decay 5e-4, Nesterov); one validation batch per epoch; CPU, all cores to one process.
- train.py: `python train.py model=... dataset=synthetic ...` with its defaults (TensorBoard,
  progress bar, last.pt/best.pt each epoch).
- Lightning: bench/peers_lightning.py, `lightning.Trainer` with its defaults (TensorBoard,
  progress bar, a checkpoint each epoch).
- hand-written loop: bench/plain_loop.py --sliced: in-memory tensors sliced by a random
  permutation, no DataLoader, no logging, no checkpoints: the floor.

Throughput is measured from outside: each program runs for 40 optimizer steps and for the case's
long count (1,040 or 240), and samples/s = (long − 40) × batch / (wall(long) − wall(40)), so
start-up and shutdown cancel and every per-step and per-epoch cost counts. The 40-step run's wall
is the "start-up + 40 steps" column. Each round runs every program once per size, in an order
rotated per round; ratios are medians of per-round ratios, printed with their range.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import ROOT, median, per_round, spread, table

TRAIN_SIZE, VAL_SIZE = 2048, 512
LIGHTNING_HINT = "bench.peers needs Lightning: make bench-deps (pip install -r requirements-bench.txt into .venv)"


@dataclass(frozen=True)
class Case:
    model: str
    channels: int
    size: int
    batch: int
    long_steps: int

    @property
    def name(self) -> str:
        return f"{self.model} {self.channels}x{self.size}x{self.size}, batch {self.batch}"

    def epochs(self, steps: int) -> int:
        return -(-steps * self.batch // TRAIN_SIZE)


# mnist_net trains several times slower than simple_cnn on CPU: fewer long steps keep its long run near simple_cnn's.
CASES = [Case("simple_cnn", 3, 32, 128, 1040), Case("mnist_net", 1, 28, 64, 240)]
SHORT_STEPS = 40


def train_py(case: Case, steps: int, out: Path) -> list[str]:
    return [
        sys.executable,
        "train.py",
        f"hydra.run.dir={out}",
        f"model={case.model}",
        "dataset=synthetic",
        f"dataset.channels={case.channels}",
        f"dataset.image_size={case.size}",
        f"dataset.train_size={TRAIN_SIZE}",
        f"dataset.val_size={VAL_SIZE}",
        f"trainer.batch_size={case.batch}",
        "trainer.accelerator=cpu",
        "optimizer=sgd",
        "scheduler=none",
        "trainer.limit_val_batches=1",
        f"trainer.max_steps={steps}",
        f"trainer.epochs={case.epochs(steps)}",
    ]


def lightning(case: Case, steps: int, out: Path) -> list[str]:
    return [sys.executable, "-m", "bench.peers_lightning", *_case_options(case, steps), "--root", str(out)]


def plain(case: Case, steps: int, out: Path) -> list[str]:
    return [sys.executable, "-m", "bench.plain_loop", "--sliced", *_case_options(case, steps)]


def _case_options(case: Case, steps: int) -> list[str]:
    """The case, as the Lightning script and the hand-written loop both take it."""
    options = {
        "--model": case.model,
        "--channels": case.channels,
        "--image-size": case.size,
        "--train-size": TRAIN_SIZE,
        "--val-size": VAL_SIZE,
        "--batch-size": case.batch,
        "--max-steps": steps,
    }
    return [str(word) for option in options.items() for word in option]


PLAIN = "hand-written loop"
PROGRAMS = {"train.py": train_py, "Lightning": lightning, PLAIN: plain}


def wall(cmd: list[str], out: Path) -> float:
    """Seconds from start to exit; output goes to a file, as a user's would to a terminal or log."""
    with open(out / "output.txt", "w") as log:
        start = time.perf_counter()
        code = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
        seconds = time.perf_counter() - start
    if code != 0:
        sys.exit(f"{' '.join(cmd[1:4])} ... failed (exit {code}):\n{(out / 'output.txt').read_text()[-3000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one round of tiny runs, first case only: a smoke run")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-lightning", action="store_true", help="train.py and the hand-written loop only")
    args = parser.parse_args()
    programs = {k: v for k, v in PROGRAMS.items() if not (args.no_lightning and k == "Lightning")}
    if "Lightning" in programs and importlib.util.find_spec("lightning") is None:
        print(LIGHTNING_HINT, file=sys.stderr)
        sys.exit(2)
    short, cases, rounds = SHORT_STEPS, CASES, args.rounds
    if args.quick:
        first = CASES[0]
        short, cases, rounds = 2, [Case(first.model, first.channels, first.size, first.batch, 4)], 1

    # walls[case][program]: one (short, long) pair per round
    walls = {case: {name: [] for name in programs} for case in cases}
    names = list(programs)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for case in cases:
            for name in order:
                pair = []
                for steps in (short, case.long_steps):
                    with tempfile.TemporaryDirectory() as out:
                        pair.append(wall(programs[name](case, steps, Path(out)), Path(out)))
                walls[case][name].append(tuple(pair))

    rows = []
    for case in cases:
        speed = {
            name: [(case.long_steps - short) * case.batch / (long - brief) for brief, long in pairs]
            for name, pairs in walls[case].items()
        }
        startup = {name: [brief for brief, _ in pairs] for name, pairs in walls[case].items()}
        for name in programs:
            vs_plain = per_round(speed[name], speed[PLAIN])
            rows.append(
                [case.name, name, median(speed[name]), median(vs_plain), spread(vs_plain), median(startup[name])]
            )
        if "Lightning" in programs:
            vs_lightning = per_round(speed["train.py"], speed["Lightning"])
            rows.append(
                [
                    case.name,
                    "train.py / Lightning",
                    median(vs_lightning),
                    "",
                    spread(vs_lightning),
                    median(per_round(startup["train.py"], startup["Lightning"])),
                ]
            )
    print(
        table(
            [
                "case",
                "program",
                "samples/s (median)",
                f"/ {PLAIN} (median of rounds)",
                "range of the rounds' throughput ratios",
                f"start-up + {short} steps (s)",
            ],
            rows,
        )
    )
    print(
        f"\n{rounds} round(s); samples/s from {short} vs {', '.join(str(c.long_steps) for c in cases)} steps; "
        "ratio rows are medians of per-round ratios"
    )


if __name__ == "__main__":
    main()

"""Seconds from the command to the end of its first optimizer step, against a bare `import torch`.

python -m bench.startup [--quick] [--repeats 5]

Start-up is what a user waits through on every run and every sweep job: interpreter, imports,
config composition, data and model building, TensorBoard's writer, and the first step itself.
train.py, given bench/first_step.py's callback, prints FIRST_STEP (rank 0) right after its first
optimizer step; the benchmark clocks that line on stdout. Target, for the default job: at most 2 s above
`python -c "import torch"`. A second baseline adds what any torch training script pays before its
first step: the first optimizer imports torch._dynamo. The peers job (bench.peers: simple_cnn on
synthetic 3x32x32, batch 128) is clocked the same way under train.py and under Lightning's Trainer
(bench/peers_lightning.py prints the same line); without Lightning installed its row is left out.
Each round runs every command once, in an order rotated per round; the ratio is the median of
per-round ratios.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time

from bench.common import FIRST_STEP, FIRST_STEP_CALLBACK, ROOT, median, per_round, table, verdict

TARGET_S = 2.0
BARE = "import torch"
WITH_OPTIMIZER = "import torch; torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)"
PEERS_JOB = [
    "model=simple_cnn",
    "dataset=synthetic",
    "trainer.batch_size=128",
    "trainer.accelerator=cpu",
    "optimizer=sgd",
    "scheduler=none",
    "trainer.limit_val_batches=1",
]
LIGHTNING_JOB = [
    "-m",
    "bench.peers_lightning",
    "--model",
    "simple_cnn",
    "--channels",
    "3",
    "--image-size",
    "32",
    "--batch-size",
    "128",
    "--max-steps",
    "1",
]


def to_exit(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - start


def to_first_step(args: list[str], out_dir_arg: str) -> float:
    """Seconds until the command prints FIRST_STEP; it then runs to its exit (one step in all)."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, *args, out_dir_arg + out]
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seconds, lines = None, []
        for line in proc.stdout:
            lines.append(line)
            if seconds is None and FIRST_STEP in line:
                seconds = time.perf_counter() - start
        if proc.wait() != 0 or seconds is None:
            tail = "".join(lines[-20:])
            sys.exit(f"{' '.join(args[:3])} ... exited {proc.returncode} without printing {FIRST_STEP!r}:\n{tail}")
        return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one round instead of five")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rounds = 1 if args.quick else args.repeats

    ours = ["train.py", "trainer.max_steps=1", FIRST_STEP_CALLBACK]
    commands = {
        f"python -c '{BARE}'": lambda: to_exit(BARE),
        f"python -c '{WITH_OPTIMIZER}'": lambda: to_exit(WITH_OPTIMIZER),
        "python train.py (default job), to its first optimizer step": lambda: to_first_step(ours, "hydra.run.dir="),
        "python train.py (peers job), to its first optimizer step": (
            lambda: to_first_step([*ours, *PEERS_JOB], "hydra.run.dir=")
        ),
    }
    if importlib.util.find_spec("lightning") is not None:
        commands["Lightning Trainer (peers job), to its first optimizer step"] = lambda: to_first_step(
            LIGHTNING_JOB, "--root="
        )
    seconds = {name: [] for name in commands}
    names = list(commands)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            seconds[name].append(commands[name]())

    bare = median(seconds[names[0]])
    rows = [[names[0], bare, "", ""]]
    for name in names[1:]:
        above = median(seconds[name]) - bare
        target = verdict(above, TARGET_S, higher_is_better=False) if "default job" in name else ""
        rows.append([name, median(seconds[name]), above, target])
    print(table(["command", "seconds (median)", "above bare import (s)", f"target ≤ {TARGET_S} s above"], rows))
    if len(names) == 5:
        ratio = median(per_round(seconds[names[3]], seconds[names[4]]))
        print(
            f"\ntrain.py / Lightning to the first optimizer step, peers job: {ratio:.3f} (median of per-round ratios)"
        )
    else:
        print("\nLightning is not installed (make bench-deps): its row is left out")


if __name__ == "__main__":
    main()

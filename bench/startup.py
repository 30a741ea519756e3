"""Seconds from `python train.py` to its first training step, against a bare `import torch`.

python -m bench.startup [--quick]

Start-up is what a user waits through on every run and every sweep job: interpreter, imports,
config composition, data and model building. The first step begins right after train.py logs
the run's summary line (training/run.py), which the benchmark waits for on stdout.
Target: at most 2 s above `python -c "import torch"`. A second baseline adds what any torch
training script pays before its first step: the first optimizer imports torch._dynamo.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time

from bench.common import ROOT, median, table, verdict, wall

TARGET_S = 2.0
BARE = "import torch"
WITH_OPTIMIZER = "import torch; torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)"
READY = " from epoch "  # the last line train.py logs before its first step


def time_to_first_step() -> float:
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = [sys.executable, "train.py", f"hydra.run.dir={run_dir}", "trainer.progress_bar=false", "trainer.max_steps=1"]
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seconds = None
        for line in proc.stdout:
            if seconds is None and READY in line:
                seconds = time.perf_counter() - start
        if proc.wait() != 0 or seconds is None:
            sys.exit(f"train.py failed or never reached its first step (exit {proc.returncode})")
        return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one run of each instead of the median of five")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats

    bare, optimizer, ours = [], [], []
    for _ in range(repeats):
        bare.append(wall([sys.executable, "-c", BARE]))
        optimizer.append(wall([sys.executable, "-c", WITH_OPTIMIZER]))
        ours.append(time_to_first_step())
    extra = median(ours) - median(bare)
    rows = [
        [f"python -c '{BARE}'", median(bare), "", ""],
        [f"python -c '{WITH_OPTIMIZER}'", median(optimizer), median(optimizer) - median(bare), ""],
        ["python train.py, to its first step", median(ours), extra, verdict(extra, TARGET_S, higher_is_better=False)],
    ]
    print(table(["command", "seconds (median)", "above bare import (s)", f"target ≤ {TARGET_S} s above"], rows))


if __name__ == "__main__":
    main()

"""What a warm compile cache saves a search's trial (or a requeued run): seconds to the first
optimizer step of a trainer.compile=true job, into an empty cache and into the one an earlier job of
the same sweep left in the sweep dir (training/compile_cache.py).

python -m bench.compile_cache [--repeats 3] [train.py overrides ...]

Each round makes a fresh sweep dir and runs two one-job sweeps into it, each a process of its own:
the first compiles into the empty cache (cold), the second finds its kernels there (warm: another
trial, or the job again after a requeue on another node). TORCHINDUCTOR_CACHE_DIR is unset for both,
as a user's is. The figure per round is warm / cold; the table gives the medians.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from bench.common import FIRST_STEP, FIRST_STEP_CALLBACK, ROOT, median, table

JOB = [
    "train.py",
    "-m",
    "trainer.compile=true",
    "trainer.max_steps=1",
    "trainer.limit_val_batches=1",
    FIRST_STEP_CALLBACK,
]


def to_first_step(args: list[str]) -> float:
    """Seconds from the start of `python <args>` until it logs its first optimizer step; it then runs to its end."""
    start, seconds = time.perf_counter(), None
    proc = subprocess.Popen(
        [sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if seconds is None and FIRST_STEP in line:
            seconds = time.perf_counter() - start
    if proc.wait() != 0 or seconds is None:
        sys.exit(f"python {' '.join(args)} exited {proc.returncode} without its first step:\n{''.join(lines[-20:])}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    args, overrides = parser.parse_known_args()
    os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    cold, warm = [], []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as sweep:
            cold.append(to_first_step([*JOB, *overrides, "trainer.seed=0", f"hydra.sweep.dir={sweep}"]))
            assert os.listdir(f"{sweep}/inductor_cache"), "the job left no compile cache in its sweep dir"
            warm.append(to_first_step([*JOB, *overrides, "trainer.seed=1", f"hydra.sweep.dir={sweep}"]))
    ratios = [w / c for w, c in zip(warm, cold)]
    print(
        table(
            ["seconds to the first optimizer step", "median", "rounds"],
            [
                ["cold: an empty cache", f"{median(cold):.1f}", " ".join(f"{s:.1f}" for s in cold)],
                ["warm: the sweep dir's cache", f"{median(warm):.1f}", " ".join(f"{s:.1f}" for s in warm)],
                ["warm / cold", f"{median(ratios):.2f}", " ".join(f"{r:.2f}" for r in ratios)],
            ],
        )
    )


if __name__ == "__main__":
    main()

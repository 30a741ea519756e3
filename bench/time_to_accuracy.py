"""The default job (`make train`): wall time from the command to its exit, and the accuracy reached.

python -m bench.time_to_accuracy [--quick]

The baseline, timed in the same run, is bench/plain_digits.py: the same work as a plain script.
Target: final validation accuracy ≥ 98 % in ≤ 10 s on 2 cores, start-up included.
"""
from __future__ import annotations

import argparse
import time

from bench.common import median, python_json, table, train

TARGET_ACC, TARGET_S = 0.98, 10.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 epoch, once: a smoke run whose figures mean nothing")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    epochs, repeats = (1, 1) if args.quick else (15, args.repeats)

    ours, plain = Timings(), Timings()
    for _ in range(repeats):
        ours.time(lambda: train(f"trainer.epochs={epochs}")["val_acc"])
        plain.time(lambda: python_json("-m", "bench.plain_digits", "--epochs", str(epochs))["val_acc"])
    rows = [ours.row("python train.py", met=ours.acc >= TARGET_ACC and ours.wall <= TARGET_S)]
    rows.append(plain.row("bench/plain_digits.py (baseline)", met=None))
    rows.append(["ratio ours / baseline (wall)", ours.wall / plain.wall, "", "", ""])
    target = f"target ≥ {TARGET_ACC:.0%} in ≤ {TARGET_S:.0f} s"
    print(table(["job", "wall (s)", "final val acc (median)", "range", target], rows))


class Timings:
    def __init__(self) -> None:
        self.walls: list[float] = []
        self.accs: list[float] = []

    def time(self, job) -> None:
        start = time.perf_counter()
        self.accs.append(job())
        self.walls.append(time.perf_counter() - start)

    @property
    def wall(self) -> float:
        return median(self.walls)

    @property
    def acc(self) -> float:
        return median(self.accs)

    def row(self, name: str, met: bool | None) -> list:
        verdict = "" if met is None else ("meets target" if met else "MISSES target")
        return [name, self.wall, f"{self.acc:.4f}", f"{min(self.accs):.4f}–{max(self.accs):.4f}", verdict]


if __name__ == "__main__":
    main()

"""The default job (`make train`): wall time from the command to its exit, and the accuracy reached.

python -m bench.time_to_accuracy [--quick] [--rounds N] [OVERRIDE ...]

The baseline is bench/plain_digits.py: the same work as a plain script. Each round runs both, in
alternating order, with the round's seed (trainer.seed=r, --seed r): 360 validation images make one
seed's accuracy a coin toss within ±1 image, so the accuracy reported is the median over seeds, and
the wall ratio is the median of the per-round ratios (this machine's neighbours swing absolute times).
Target: median final validation accuracy ≥ 98 % in ≤ 10 s on 2 cores, start-up included; ratio ≤ 1.00.
Overrides change our side only (e.g. logger=none: what TensorBoard costs the default job).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from bench.common import median, python_json, spread, table, train, verdict

TARGET_ACC, TARGET_S, TARGET_RATIO = 0.98, 10.0, 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 epoch, once: a smoke run whose figures mean nothing")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("overrides", nargs="*", help="train.py overrides for our side")
    args = parser.parse_args()
    epochs, rounds = (1, 1) if args.quick else (15, args.rounds)

    ours, plain, ratios = Timings(), Timings(), []
    for seed in range(rounds):
        jobs = [
            (
                ours,
                lambda seed=seed: train(f"trainer.epochs={epochs}", f"trainer.seed={seed}", *args.overrides)["val_acc"],
            ),
            (
                plain,
                lambda seed=seed: python_json("-m", "bench.plain_digits", "--epochs", str(epochs), "--seed", str(seed))[
                    "val_acc"
                ],
            ),
        ]
        for timings, job in jobs if seed % 2 == 0 else jobs[::-1]:
            timings.time(job)
        ratios.append(ours.walls[-1] / plain.walls[-1])
    ratio = median(ratios)
    rows = [
        ours.row(" ".join(["python train.py", *args.overrides]), met=ours.acc >= TARGET_ACC and ours.wall <= TARGET_S),
        plain.row("bench/plain_digits.py (baseline)", met=None),
        [
            "ratio ours / baseline (wall, median of rounds)",
            ratio,
            "",
            spread(ratios),
            verdict(ratio, TARGET_RATIO, higher_is_better=False),
        ],
    ]
    target = f"target ≥ {TARGET_ACC:.0%} in ≤ {TARGET_S:.0f} s; ratio ≤ {TARGET_RATIO:.2f}"
    print(table(["job", "wall (s)", "final val acc (median of seeds)", "range", target], rows))


class Timings:
    def __init__(self) -> None:
        self.walls: list[float] = []
        self.accs: list[float] = []

    def time(self, job: Callable[[], float]) -> None:
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
        said = "" if met is None else ("meets target" if met else "MISSES target")
        return [name, self.wall, f"{self.acc:.4f}", f"{min(self.accs):.4f}–{max(self.accs):.4f}", said]


if __name__ == "__main__":
    main()

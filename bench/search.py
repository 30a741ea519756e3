"""What pruning and parallel trials save a search: wall time and best value of the same digits search.

python -m bench.search [--trials 24] [--epochs 5] [--rounds 2] [--only NAME ...]

Each case is `python train.py hparams_search=digits` with --trials trials of --epochs epochs, its
sampler seeded as the search file seeds it, in a fresh sweep dir: one trial after another (the
baseline), with hydra.sweeper.pruner=median, with hydra.sweeper.n_jobs=2, and with both. Each round
runs every case once, in an order rotated per round; a case's figure is the median over the rounds
of its wall time / the baseline's in the same round. Target for pruning: at most 0.6x the baseline's
time, its best value within the rounds' spread.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench.common import ROOT, median, per_round, spread, table, verdict

TARGET = 0.6
CASES = {
    "one after another": [],
    "pruner=median": ["hydra.sweeper.pruner=median"],
    "n_jobs=2": ["hydra.sweeper.n_jobs=2"],
    "pruner=median, n_jobs=2": ["hydra.sweeper.pruner=median", "hydra.sweeper.n_jobs=2"],
}
BASELINE = "one after another"


def search(options: list[str], trials: int, epochs: int) -> tuple[float, float, int]:
    """Seconds the search took, its best value, and its pruned trials."""
    with tempfile.TemporaryDirectory() as sweep:
        cmd = [
            sys.executable,
            "train.py",
            "hparams_search=digits",
            f"hydra.sweeper.n_trials={trials}",
            f"trainer.epochs={epochs}",
            "trainer.progress_bar=false",
            f"hydra.sweep.dir={sweep}",
            *options,
        ]
        start = time.perf_counter()
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            sys.exit(f"{' '.join(cmd[1:])} failed:\n{done.stderr[-3000:]}")
        results = yaml.safe_load((Path(sweep) / "optimization_results.yaml").read_text())
        return seconds, results["best_value"], results.get("pruned", 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", nargs="+", choices=list(CASES), default=list(CASES), help="cases to run")
    args = parser.parse_args()
    names = [BASELINE, *(name for name in args.only if name != BASELINE)]
    runs: dict[str, list[tuple[float, float, int]]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            runs[name].append(search(CASES[name], args.trials, args.epochs))
            print(name, runs[name][-1], flush=True)
    base = [seconds for seconds, _, _ in runs[BASELINE]]
    rows = []
    for name in names:
        seconds, best, pruned = zip(*runs[name])
        ratios = per_round(seconds, base)
        target = verdict(median(ratios), TARGET, higher_is_better=False) if "pruner" in name else ""
        rows.append(
            [
                name,
                " ".join(f"{s:.0f}" for s in seconds),
                f"{median(ratios):.2f} ({spread(ratios)})",
                " ".join(f"{b:.4f}" for b in best),
                " ".join(map(str, pruned)),
                target,
            ]
        )
    headers = ["search", "wall s (rounds)", "time / one after another", "best value (rounds)", "pruned", "target"]
    print(table(headers, rows))


if __name__ == "__main__":
    main()

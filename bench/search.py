"""What pruning and parallel trials save a search: wall time and best value of the same digits search.

python -m bench.search [--trials 24] [--epochs 5] [--rounds 2] [--only NAME ...]

Each case is `python train.py hparams_search=digits` with --trials trials of --epochs epochs, in a
fresh sweep dir, its sampler seeded with the round's number (each round draws other trials, and the
cases of a round start from the same ones): one trial after another (the baseline), with
hydra.sweeper.pruner=median, with hydra.sweeper.n_jobs=2, with both, and with each of the other two
pruners. Each round runs every case once, in an order rotated per round; a case's figures are the medians over the
rounds of its wall time / the baseline's in the same round, and of its CPU time (the search's and
its trials' processes, user + system) / the baseline's: on a shared machine the wall time moves with
the others' load, the CPU time much less. Target for pruning: at most 0.6x the baseline's time, its
best value within the rounds' spread.
"""

from __future__ import annotations

import argparse
import resource
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
    "pruner=successive_halving": ["hydra.sweeper.pruner=successive_halving"],
    "pruner=hyperband": ["hydra.sweeper.pruner=hyperband"],
}
BASELINE = "one after another"


def search(options: list[str], trials: int, epochs: int, seed: int) -> tuple[float, float, float, int]:
    """Seconds the search took, the CPU seconds its processes used, its best value, its pruned trials."""
    with tempfile.TemporaryDirectory() as sweep:
        cmd = [
            sys.executable,
            "train.py",
            "hparams_search=digits",
            f"hydra.sweeper.n_trials={trials}",
            f"trainer.epochs={epochs}",
            f"hydra.sweeper.sampler.seed={seed}",
            "trainer.progress_bar=false",
            f"hydra.sweep.dir={sweep}",
            *options,
        ]
        start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        seconds, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        if done.returncode != 0:
            sys.exit(f"{' '.join(cmd[1:])} failed:\n{done.stderr[-3000:]}")
        results = yaml.safe_load((Path(sweep) / "optimization_results.yaml").read_text())
        return seconds, cpu, results["best_value"], results.get("pruned", 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", nargs="+", choices=list(CASES), default=list(CASES), help="cases to run")
    args = parser.parse_args()
    names = [BASELINE, *(name for name in args.only if name != BASELINE)]
    runs: dict[str, list[tuple[float, float, float, int]]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            runs[name].append(search(CASES[name], args.trials, args.epochs, seed=r))
            print(name, *(f"{x:.4g}" for x in runs[name][-1]), flush=True)
    base_wall, base_cpu, _, _ = zip(*runs[BASELINE])
    rows = []
    for name in names:
        wall, cpu, best, pruned = zip(*runs[name])
        ratios, cpu_ratios = per_round(wall, base_wall), per_round(cpu, base_cpu)
        target = verdict(median(ratios), TARGET, higher_is_better=False) if "pruner" in name else ""
        rows.append(
            [
                name,
                " ".join(f"{s:.0f}" for s in wall),
                f"{median(ratios):.2f} ({spread(ratios)})",
                " ".join(f"{s:.0f}" for s in cpu),
                f"{median(cpu_ratios):.2f} ({spread(cpu_ratios)})",
                " ".join(f"{b:.4f}" for b in best),
                " ".join(map(str, pruned)),
                target,
            ]
        )
    headers = [
        "search",
        "wall s (rounds)",
        "wall / baseline",
        "CPU s (rounds)",
        "CPU / baseline",
        "best value (rounds)",
        "pruned",
        "target (wall)",
    ]
    print(table(headers, rows))


if __name__ == "__main__":
    main()

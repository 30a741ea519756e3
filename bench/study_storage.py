"""How many trials can write to one study at once: each storage under N concurrent writers.

python -m bench.study_storage URL [URL ...] [--writers 1 8 32] [--epochs 10] [--epoch-s 0]

Each writer is a process doing what one trial of a pruned search does to the study: open it, ask
for a trial, then each epoch report its figure, ask the pruner whether to stop (which reads every
trial) and beat for it, then tell the result. All N start together (epochs back to back with
--epoch-s 0: the worst case, many trials ending their epochs at once). A URL is any
hydra.sweeper.storage (sqlite:///PATH, journal:///PATH, postgresql+psycopg://USER@HOST:PORT/DB),
opened as the sweeper opens it. Figures per storage and N: trials that failed (an operation raised:
SQLite's "database is locked"), operations that waited over 1 s, the median and longest operation,
and the wall time.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
import uuid
import warnings

import optuna

from bench.common import table
from errors import first_line
from hydra_plugins.optuna_study_sweeper import _storage

SLOW_S = 1.0
TIMEOUT_S = 900  # a writer that never answers (killed): the measurement stops, not waits for ever


def writer(url: str, study_name: str, epochs: int, epoch_s: float, start, results) -> None:
    """One trial's traffic; puts (its operations' seconds, the error that ended it or None)."""
    warnings.simplefilter("ignore")  # Optuna's experimental and heartbeat warnings, once per process
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    times: list[float] = []

    def timed(operation, *args):
        began = time.perf_counter()
        try:
            return operation(*args)
        finally:
            times.append(time.perf_counter() - began)

    start.wait()  # before anything that may fail: a writer missing at the barrier would hold up the others
    try:
        storage = timed(_storage.open_storage, url, 60, None)
        pruner = optuna.pruners.MedianPruner(n_startup_trials=0)
        study = timed(lambda: optuna.load_study(study_name=study_name, storage=storage, pruner=pruner))
        trial = timed(study.ask)
        for epoch in range(epochs):
            time.sleep(epoch_s)
            timed(trial.report, 1.0 - 1.0 / (epoch + 2), epoch)
            timed(trial.should_prune)
            timed(storage.record_heartbeat, trial._trial_id)
        timed(study.tell, trial, 0.5)
        results.put((times, None))
    except Exception as e:
        results.put((times, f"{type(e).__name__}: {first_line(e.__cause__ or e)[:120]}"))


def measure(url: str, writers: int, epochs: int, epoch_s: float) -> list[object]:
    name = f"bench-{uuid.uuid4().hex[:8]}"
    storage = _storage.open_storage(url, heartbeat_interval=60, grace_period=None)
    optuna.create_study(study_name=name, storage=storage, direction="maximize")
    context = multiprocessing.get_context("fork")  # optuna and SQLAlchemy imported once
    start, results = context.Barrier(writers + 1), context.Queue()
    processes = [
        context.Process(target=writer, args=(url, name, epochs, epoch_s, start, results)) for _ in range(writers)
    ]
    for process in processes:
        process.start()
    start.wait()
    began = time.perf_counter()
    outcomes = [results.get(timeout=TIMEOUT_S) for _ in processes]
    wall = time.perf_counter() - began
    for process in processes:
        process.join()
    times = [t for ts, _ in outcomes for t in ts]
    errors = [error for _, error in outcomes if error]
    return [
        url.split(":", 1)[0],
        writers,
        f"{len(errors)} ({errors[0]})" if errors else "0",
        sum(t > SLOW_S for t in times),
        f"{1000 * statistics.median(times):.1f}" if times else "—",
        f"{max(times):.2f}" if times else "—",
        f"{wall:.1f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("urls", nargs="+", metavar="URL", help="a storage, as hydra.sweeper.storage takes it")
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 8, 32], help="trials at once")
    parser.add_argument("--epochs", type=int, default=10, help="reports per trial")
    parser.add_argument("--epoch-s", type=float, default=0.0, help="seconds between a trial's reports")
    args = parser.parse_args()
    rows = [measure(url, n, args.epochs, args.epoch_s) for n in args.writers for url in args.urls]
    headers = ["storage", "writers", "trials failed", f"ops > {SLOW_S:g} s", "median op ms", "max op s", "wall s"]
    print(table(headers, rows))


if __name__ == "__main__":
    main()

"""Summarise a sweep: python -m bench.report <sweep or outputs dir> [--png PATH].

Reads every run's metrics.json under the directory, prints a markdown table (throughput,
speed-up and scaling efficiency against the 1-device run of the same model, dataset and batch,
accuracy, peak memory per device) and plots throughput, efficiency and accuracy to report.png.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Run:
    name: str  # the run's directory, relative to the directory reported on
    strategy: str
    devices: int
    model: str
    dataset: str
    batch_size: int | None  # None: written before metrics.json recorded it
    samples_per_s: float
    val_acc: float
    best_val_acc: float
    wall_s: float
    peak_memory_mb: float | None

    @property
    def workload(self) -> tuple[str, str, int | None]:
        """Runs that train the same thing: their throughputs compare."""
        return self.model, self.dataset, self.batch_size


@dataclass(frozen=True)
class Row:
    run: Run
    speedup: float | None  # None: no 1-device run of the same workload to compare with
    efficiency: float | None


def load_runs(root: Path) -> list[Run]:
    runs = []
    for path in sorted(root.rglob("metrics.json")):
        try:
            runs.append(_run(str(path.parent.relative_to(root)), json.loads(path.read_text())))
        except (json.JSONDecodeError, KeyError) as e:
            print(f"skipped {path}: not a metrics.json written by train.py ({type(e).__name__}: {e})", file=sys.stderr)
    return runs


def _run(name: str, m: dict[str, Any]) -> Run:
    return Run(
        name=name,
        strategy=m.get("strategy", "?"),
        devices=int(m.get("devices", m.get("world_size", 1))),
        model=m.get("model", "?"),
        dataset=m.get("dataset", "?"),
        batch_size=m.get("batch_size"),
        samples_per_s=float(m["train_samples_per_s"]),
        val_acc=float(m["val_acc"]),
        best_val_acc=float(m.get("best_val_acc", m["val_acc"])),
        wall_s=float(m.get("wall_s", float("nan"))),
        peak_memory_mb=_largest(m.get("peak_memory_mb")),
    )


def _largest(peak: float | list[float] | None) -> float | None:
    """One figure per device, or one for all: the largest is the one that must fit."""
    return max(peak, default=None) if isinstance(peak, list) else peak


def scaling(samples_per_s: float, devices: int, baseline_samples_per_s: float) -> tuple[float, float]:
    """Speed-up over one device, and efficiency: the share of a perfect N-fold speed-up reached."""
    speedup = samples_per_s / baseline_samples_per_s
    return speedup, speedup / devices


def baseline(run: Run, runs: list[Run]) -> Run | None:
    """The 1-device run of the same workload, with the same strategy if there is one."""
    candidates = [r for r in runs if r.devices == 1 and r.workload == run.workload]
    same = [r for r in candidates if r.strategy == run.strategy]
    return (same or candidates or [None])[0]


def rows(runs: list[Run]) -> list[Row]:
    result = []
    for run in sorted(runs, key=lambda r: (r.model, r.dataset, r.batch_size or 0, r.devices, r.strategy, r.name)):
        base = baseline(run, runs)
        speedup, efficiency = scaling(run.samples_per_s, run.devices, base.samples_per_s) if base else (None, None)
        result.append(Row(run, speedup, efficiency))
    return result


def markdown(table: list[Row]) -> str:
    lines = [
        "| strategy | devices | model | dataset | batch | samples/s | speed-up | efficiency | val acc | best acc "
        "| peak MB/device | run |",
        "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in table:
        r = row.run
        lines.append(
            f"| {r.strategy} | {r.devices} | {r.model} | {r.dataset} | {_or_dash(r.batch_size, '{}')} "
            f"| {r.samples_per_s:,.0f} | {_or_dash(row.speedup, '{:.2f}×')} | {_or_dash(row.efficiency, '{:.0%}')} "
            f"| {r.val_acc:.2%} | {r.best_val_acc:.2%} | {_or_dash(r.peak_memory_mb, '{:,.0f}')} | {r.name} |"
        )
    return "\n".join(lines)


def _or_dash(value: Any, fmt: str) -> str:
    return "—" if value is None else fmt.format(value)


def plot(table: list[Row], path: Path) -> None:
    """Throughput and efficiency against devices, one line per strategy and workload; accuracy against wall time."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a file is the point
    import matplotlib.pyplot as plt

    series: dict[str, list[Row]] = {}
    several_workloads = len({row.run.workload for row in table}) > 1
    for row in table:
        r = row.run
        label = f"{r.strategy} {r.model}/{r.dataset}/b{r.batch_size}" if several_workloads else r.strategy
        series.setdefault(label, []).append(row)
    fig, (throughput, efficiency, accuracy) = plt.subplots(1, 3, figsize=(15, 4.5))
    for label, points in series.items():
        points = sorted(points, key=lambda row: row.run.devices)
        devices = [row.run.devices for row in points]
        (line,) = throughput.plot(devices, [row.run.samples_per_s for row in points], "o-", label=label)
        scaled = [(row.run.devices, row.efficiency) for row in points if row.efficiency is not None]
        if scaled:
            efficiency.plot(*zip(*scaled), "o-", color=line.get_color(), label=label)
        accuracy.scatter([row.run.wall_s for row in points], [row.run.best_val_acc for row in points],
                         color=line.get_color(), label=label)
    efficiency.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    devices = sorted({row.run.devices for row in table})
    for ax, title, ylabel in (
        (throughput, "Throughput", "samples/s"),
        (efficiency, "Scaling efficiency vs 1 device", "speed-up / devices"),
    ):
        ax.set(title=title, xlabel="devices", ylabel=ylabel, xticks=devices)
        ax.set_ylim(bottom=0)  # from zero, so a 10 % gain looks like one
    accuracy.set(title="Accuracy vs wall time", xlabel="wall time (s)", ylabel="best val accuracy")
    throughput.legend(fontsize="small")
    for ax in (throughput, efficiency, accuracy):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="a sweep dir (multirun/<date>/<time>) or outputs/")
    parser.add_argument("--png", type=Path, help="where to write the plot (default: <directory>/report.png)")
    args = parser.parse_args(argv)
    runs = load_runs(args.directory) if args.directory.is_dir() else []
    if not runs:
        print(
            f"error: no metrics.json under {args.directory}; point at a sweep dir such as multirun/<date>/<time>, "
            "or run one first: python train.py -m sweep=scaling",
            file=sys.stderr,
        )
        return 2
    table = rows(runs)
    print(markdown(table))
    png = args.png or args.directory / "report.png"
    plot(table, png)
    print(f"\nplot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

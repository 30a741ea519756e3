"""Summarise a sweep: python -m bench.report <sweep or outputs dir> [--png PATH].

Reads every run's metrics.json under the directory and the overrides that made it
(.hydra/overrides.yaml), prints a markdown table with a column per override that differs between
the runs, speed-up and scaling efficiency where runs differ in device count and nothing else,
and, for an hparams_search, the best trial from optimization_results.yaml. report.png holds the
plots that fit: scaling against devices when devices vary, else the optimised metric per
configuration; accuracy against wall time; the metric over a search's trials.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# Overrides that only change how many devices train: runs differing in these alone compare in speed.
DEVICE_KEYS = frozenset({"trainer.devices", "trainer.gpus", "trainer.num_nodes"})
# Overrides that pick a strategy and a device count together (conf/parallelism, swept by
# sweep=strategies): metrics.json records both, so a run's identity keeps its strategy without them.
LAYOUT_KEYS = frozenset({"parallelism"})
# Swept keys the table already shows in a column of its own.
SHOWN = frozenset({"strategy", "model", "dataset", "trainer.batch_size"}) | DEVICE_KEYS | LAYOUT_KEYS
SEARCH_RESULTS = "optimization_results.yaml"  # written by the hparams_search sweeper in the sweep dir


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
    state_mb_per_rank: float | None = None  # parameters + gradients + optimizer state, the fullest rank
    overrides: tuple[tuple[str, str], ...] = ()  # (key, value) from .hydra/overrides.yaml, as typed
    objective: str = "best_val_acc"  # the run's optimized_metric
    objective_value: float | None = None

    @property
    def identity(self) -> tuple[Any, ...]:
        """Everything but the device count: runs with the same identity differ only in devices."""
        rest = tuple((k, v) for k, v in self.overrides if k not in DEVICE_KEYS | LAYOUT_KEYS)
        return rest, self.strategy, self.model, self.dataset, self.batch_size


@dataclass(frozen=True)
class Row:
    run: Run
    speedup: float | None  # None: no 1-device run that differs from this one in device count alone, or only itself
    efficiency: float | None


def load_runs(root: Path) -> list[Run]:
    runs = []
    for path in sorted(root.rglob("metrics.json"), key=lambda p: _natural(str(p.parent.relative_to(root)))):
        try:
            metrics = json.loads(path.read_text())
            if "weights" in metrics:  # trainer.test_only's: what it evaluated, with no training to compare
                print(f"skipped {path}: a trainer.test_only evaluation, not a training run", file=sys.stderr)
                continue
            runs.append(_run(str(path.parent.relative_to(root)), metrics, path.parent))
        except (json.JSONDecodeError, KeyError) as e:
            print(f"skipped {path}: not a metrics.json written by train.py ({type(e).__name__}: {e})", file=sys.stderr)
    return runs


def _natural(name: str) -> list[Any]:
    """Job 10 after job 9."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _run(name: str, m: dict[str, Any], run_dir: Path) -> Run:
    objective = _optimized_metric(run_dir)
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
        state_mb_per_rank=_state_mb(m),
        overrides=read_overrides(run_dir),
        objective=objective,
        objective_value=float(m[objective]) if isinstance(m.get(objective), (int, float)) else None,
    )


def read_overrides(run_dir: Path) -> tuple[tuple[str, str], ...]:
    """The command-line overrides Hydra recorded for the run, as (key, value); none if it kept no record."""
    path = run_dir / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return ()
    from hydra.core.override_parser.overrides_parser import OverridesParser

    lines = [str(line) for line in yaml.safe_load(path.read_text()) or []]
    return tuple(
        (o.key_or_group, o.get_value_element_as_str()) for o in OverridesParser.create().parse_overrides(lines)
    )


def _optimized_metric(run_dir: Path) -> str:
    path = run_dir / ".hydra" / "config.yaml"
    config = yaml.safe_load(path.read_text()) if path.is_file() else None
    return (config or {}).get("optimized_metric") or "best_val_acc"


def _state_mb(m: dict[str, Any]) -> float | None:
    """What the fullest rank holds for training, from its local shards (fsdp: about 1/N of ddp's)."""
    parts = [m.get(key) for key in ("param_bytes_per_rank", "grad_bytes_per_rank", "optimizer_bytes_per_rank")]
    if not all(isinstance(part, list) and part for part in parts):
        return None  # written before metrics.json recorded them
    return max(sum(ranks) for ranks in zip(*parts)) / 1e6


def _largest(peak: float | list[float] | None) -> float | None:
    """One figure per device, or one for all: the largest is the one that must fit."""
    return max(peak, default=None) if isinstance(peak, list) else peak


def swept_keys(runs: list[Run]) -> list[str]:
    """Override keys whose value is not the same in every run (absent counts as a value), in command-line order."""
    keys: dict[str, None] = {}
    for run in runs:
        keys.update(dict.fromkeys(k for k, _ in run.overrides))
    return [k for k in keys if len({dict(run.overrides).get(k) for run in runs}) > 1]


def label(run: Run, keys: list[str]) -> str:
    """The run named by the overrides that tell it from the others; its directory if none do."""
    values = dict(run.overrides)
    return " ".join(f"{k}={short(values[k])}" for k in keys if k in values) or run.name


def plot_label(run: Run, keys: list[str], longest: int = 40) -> str:
    """label(), or where that is too long for a plot (a search's sampled floats), the job number."""
    text = label(run, keys)
    number = re.match(r"\d+", run.name)
    return text if len(text) <= longest or number is None else f"#{number.group()}"


def short(value: str | None) -> str:
    """Sampled floats (0.015171717849735478) to 4 significant digits; anything else as it is."""
    if value is None:
        return "—"
    try:
        number = float(value)
    except ValueError:
        return value
    return value if re.fullmatch(r"[+-]?\d+", value) else f"{number:.4g}"


def scaling(samples_per_s: float, devices: int, baseline_samples_per_s: float) -> tuple[float, float]:
    """Speed-up over one device, and efficiency: the share of a perfect N-fold speed-up reached."""
    speedup = samples_per_s / baseline_samples_per_s
    return speedup, speedup / devices


def baseline(run: Run, runs: list[Run]) -> Run | None:
    """The 1-device run that differs from `run` in device count and nothing else."""
    return next((r for r in runs if r.devices == 1 and r.identity == run.identity), None)


def rows(runs: list[Run]) -> list[Row]:
    """A speed-up only where the same configuration ran on more than one device count."""
    counts: dict[tuple[Any, ...], set[int]] = {}
    for run in runs:
        counts.setdefault(run.identity, set()).add(run.devices)
    result = []
    for run in runs:
        base = baseline(run, runs) if len(counts[run.identity]) > 1 else None
        speedup, efficiency = scaling(run.samples_per_s, run.devices, base.samples_per_s) if base else (None, None)
        result.append(Row(run, speedup, efficiency))
    return result


def markdown(table: list[Row]) -> str:
    runs = [row.run for row in table]
    extra = [k for k in swept_keys(runs) if k not in SHOWN]
    objectives = sorted({r.objective for r in runs} - {"val_acc", "best_val_acc"})
    header = [*extra, "strategy", "devices", "model", "dataset", "batch", "samples/s", "speed-up", "efficiency",
              "val acc", "best acc", *objectives, "state MB/rank", "peak MB/device", "run"]
    align = [*("---" for _ in extra), "---", "---:", "---", "---", *("---:" for _ in range(8 + len(objectives))), "---"]
    lines = [f"| {' | '.join(header)} |", f"| {' | '.join(align)} |"]
    for row in table:
        r = row.run
        values = dict(r.overrides)
        cells = [
            *(short(values.get(k)) for k in extra), r.strategy, str(r.devices), r.model, r.dataset,
            _or_dash(r.batch_size, "{}"), f"{r.samples_per_s:,.0f}", _or_dash(row.speedup, "{:.2f}×"),
            _or_dash(row.efficiency, "{:.0%}"), f"{r.val_acc:.2%}", f"{r.best_val_acc:.2%}",
            *(_or_dash(r.objective_value if r.objective == o else None, "{:.4g}") for o in objectives),
            _or_dash(r.state_mb_per_rank, "{:,.1f}"), _or_dash(r.peak_memory_mb, "{:,.0f}"), r.name,
        ]
        lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines)


def _or_dash(value: Any, fmt: str) -> str:
    return "—" if value is None else fmt.format(value)


def load_search(root: Path) -> dict[str, Any] | None:
    """The sweeper's own account of a search (best trial, every trial's value); None if this is no search."""
    path = root / SEARCH_RESULTS
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def search_summary(search: dict[str, Any]) -> str:
    metric = search.get("metric", "value")
    lines = [
        f"Search {search.get('study_name', '?')}: {search.get('complete', '?')} of {search.get('n_trials', '?')} "
        f"trials complete, {search.get('direction', '?')} {metric}."
    ]
    if search.get("best_params") is not None:
        params = " ".join(f"{k}={short(str(v))}" for k, v in search["best_params"].items())
        lines.append(
            f"Best: trial {search['best_trial']}, {metric} = {search['best_value']:.4g} ({params}), "
            f"run {search.get('best_job', '?')}"
        )
    return "\n".join(lines)


def plot(table: list[Row], path: Path, search: dict[str, Any] | None = None) -> None:
    """Scaling panels when devices vary, else the optimised metric per configuration; accuracy against
    wall time; and a search's metric over its trials."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a file is the point
    import matplotlib.pyplot as plt

    runs = [row.run for row in table]
    keys = swept_keys(runs)
    devices_vary = len({r.devices for r in runs}) > 1
    panels = (3 if devices_vary else 2) + (search is not None)
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4.8))
    if devices_vary:
        _scaling(axes[0], axes[1], table, [k for k in keys if k not in DEVICE_KEYS | LAYOUT_KEYS])
    else:
        _objective_per_configuration(axes[0], runs, keys)
    _accuracy_vs_wall_time(axes[2 if devices_vary else 1], runs, keys, annotate=not devices_vary)
    if search is not None:
        _search_trials(axes[-1], search)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _scaling(throughput: Any, efficiency: Any, table: list[Row], keys: list[str]) -> None:
    """Throughput and efficiency against devices, one line per configuration."""
    series: dict[tuple[Any, ...], list[Row]] = {}
    for row in table:
        series.setdefault(row.run.identity, []).append(row)
    for points in series.values():
        points = sorted(points, key=lambda row: row.run.devices)
        name = plot_label(points[0].run, keys) if keys else points[0].run.strategy
        devices = [row.run.devices for row in points]
        (line,) = throughput.plot(devices, [row.run.samples_per_s for row in points], "o-", label=name)
        scaled = [(row.run.devices, row.efficiency) for row in points if row.efficiency is not None]
        if scaled:
            efficiency.plot(*zip(*scaled), "o-", color=line.get_color(), label=name)
    efficiency.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ticks = sorted({row.run.devices for row in table})
    for ax, title, ylabel in (
        (throughput, "Throughput", "samples/s"),
        (efficiency, "Scaling efficiency vs 1 device", "speed-up / devices"),
    ):
        ax.set(title=title, xlabel="devices", ylabel=ylabel, xticks=ticks)
        ax.set_ylim(bottom=0)  # from zero, so a 10 % gain looks like one
    throughput.legend(fontsize="small")


def _objective_per_configuration(ax: Any, runs: list[Run], keys: list[str]) -> None:
    objective = runs[0].objective if len({r.objective for r in runs}) == 1 else "best_val_acc"
    values = [r.objective_value if r.objective == objective else r.best_val_acc for r in runs]
    positions = range(len(runs))
    ax.barh(positions, [v if v is not None else 0.0 for v in values], color="tab:blue")
    ax.set_yticks(positions, [plot_label(r, keys) for r in runs], fontsize="small")
    ax.invert_yaxis()  # first run on top, as in the table
    ax.set(title=f"{objective} per configuration", xlabel=objective)


def _accuracy_vs_wall_time(ax: Any, runs: list[Run], keys: list[str], annotate: bool) -> None:
    ax.scatter([r.wall_s for r in runs], [r.best_val_acc for r in runs], color="tab:blue")
    if annotate:
        for r in runs:
            ax.annotate(plot_label(r, keys), (r.wall_s, r.best_val_acc), fontsize="x-small",
                        xytext=(4, 4), textcoords="offset points")
        ax.margins(x=0.3, y=0.1)  # room for the labels of the outermost points
    ax.set(title="Accuracy vs wall time", xlabel="wall time (s)", ylabel="best val accuracy")


def _search_trials(ax: Any, search: dict[str, Any]) -> None:
    """Each complete trial's value by trial number, the best so far as a step line, the best trial ringed."""
    metric = search.get("metric", "value")
    done = [(t["number"], t["value"]) for t in search.get("trials") or [] if t.get("state") == "COMPLETE"]
    if done:
        numbers, values = zip(*done)
        better = max if search.get("direction") == "maximize" else min
        best_so_far = [better(values[: i + 1]) for i in range(len(values))]
        ax.plot(numbers, values, "o", label="trial")
        ax.step(numbers, best_so_far, where="post", label="best so far")
        if search.get("best_trial") is not None:
            ax.plot([search["best_trial"]], [search["best_value"]], "o", markersize=12, fillstyle="none",
                    color="tab:red", label=f"best: trial {search['best_trial']}")
        ax.legend(fontsize="small")
    ax.set(title=f"{metric} over the trials", xlabel="trial (#job)", ylabel=metric)


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
    search = load_search(args.directory)
    print(markdown(table))
    if search is not None:
        print(f"\n{search_summary(search)}")
    png = args.png or args.directory / "report.png"
    plot(table, png, search)
    print(f"\nplot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

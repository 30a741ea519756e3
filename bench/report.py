"""Summarise a sweep: python -m bench.report <sweep or outputs dir> [--png PATH].

Reads every run's metrics.json under the directory, the overrides that made it
(.hydra/overrides.yaml) and the config it ran with (.hydra/config.yaml, .hydra/hydra.yaml's group
choices), prints a markdown table with a column per overridden key whose value differs between the
runs (each cell what that run used, override or default), the commit and torch it trained with
(its manifest.json), speed-up and scaling efficiency where
runs differ in device count and nothing else, and, for an hparams_search, the best trial from
optimization_results.yaml. report.png holds the plots that fit: scaling against devices when
devices vary, else the optimised metric per configuration; accuracy against wall time; the metric
over a search's trials. Runs are labelled by their own overrides, shortened from the middle where
long, with a legend under the plots that gives each shortened label's overrides and each trial's
parameters.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from training.loggers.tensorboard import HPARAM_METRICS
from training.manifest import read_manifest

# Overrides that only change how many devices train: runs differing in these alone compare in speed.
DEVICE_KEYS = frozenset({"trainer.devices", "trainer.gpus", "trainer.num_nodes"})
# Overrides that pick a strategy and a device count together (conf/parallelism, swept by
# sweep=strategies): metrics.json records both, so a run's identity keeps its strategy without them.
LAYOUT_KEYS = frozenset({"parallelism"})
# Swept keys the table already shows in a column of its own.
SHOWN = frozenset({"strategy", "model", "dataset", "trainer.batch_size"}) | DEVICE_KEYS | LAYOUT_KEYS
SEARCH_RESULTS = "optimization_results.yaml"  # written by the hparams_search sweeper in the sweep dir
# A run's samples/s (training.metrics.samples_per_s), titled as in the HParams tab.
SAMPLES_PER_S = HPARAM_METRICS["throughput/median_samples_per_s"]


@dataclass(frozen=True)
class Run:
    name: str  # the run's directory, relative to the directory reported on
    strategy: str
    devices: int
    model: str
    dataset: str
    batch_size: int | None  # None: written before metrics.json recorded it
    samples_per_s: float  # metrics.json's train_samples_per_s (training.metrics.samples_per_s)
    val_acc: float
    best_val_acc: float
    wall_s: float
    peak_memory_mb: float | None
    state_mb_per_rank: float | None = None  # parameters + gradients + optimizer state, the fullest rank
    overrides: tuple[tuple[str, str], ...] = ()  # (key, value) from .hydra/overrides.yaml, as typed
    objective: str = "best_val_acc"  # the run's optimized_metric
    objective_value: float | None = None
    # Every key of .hydra/config.yaml (dotted) and every group's option (.hydra/hydra.yaml), as a
    # config spells them: what the run used where it overrode nothing.
    settings: Mapping[str, str] = field(default_factory=dict, compare=False)
    manifest: Mapping[str, Any] = field(default_factory=dict, compare=False)  # its manifest.json; {}: none

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
    settings = read_settings(run_dir)
    objective = settings.get("optimized_metric", "null")
    objective = "best_val_acc" if objective == "null" else objective
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
        settings=settings,
        manifest=read_manifest(run_dir) or {},
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


def read_settings(run_dir: Path) -> dict[str, str]:
    """What the run's record says it used: {dotted key: value} from .hydra/config.yaml, and
    {group: option} from .hydra/hydra.yaml (optimizer: sgd); empty if it kept no record."""
    record = run_dir / ".hydra"
    settings: dict[str, str] = {}
    if (record / "config.yaml").is_file():
        _flatten(yaml.safe_load((record / "config.yaml").read_text()) or {}, "", settings)
    if (record / "hydra.yaml").is_file():
        hydra = yaml.safe_load((record / "hydra.yaml").read_text()) or {}
        choices = hydra.get("hydra", {}).get("runtime", {}).get("choices") or {}
        settings.update((group, _spelled(option)) for group, option in choices.items())
    return settings


def _flatten(node: Mapping[str, Any], prefix: str, into: dict[str, str]) -> None:
    for key, value in node.items():
        if isinstance(value, Mapping):
            _flatten(value, f"{prefix}{key}.", into)
        else:
            into[f"{prefix}{key}"] = _spelled(value)


def _spelled(value: Any) -> str:
    """A YAML value as an override would give it: null, true, 0.05."""
    return json.dumps(value) if value is None or isinstance(value, (bool, list)) else str(value)


def used(run: Run, key: str) -> str | None:
    """What the run used for `key`: its override as typed, else its config's value (for a group,
    the option Hydra picked); None where the run kept no record of it."""
    return dict(run.overrides).get(key, run.settings.get(key))


def _comparable(value: str | None) -> Any:
    """1 and 1.0 are one value."""
    try:
        return float(value) if value is not None else None
    except ValueError:
        return value


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
    """Overridden keys whose value, as each run used it, is not the same in every run, in command-line order."""
    keys: dict[str, None] = {}
    for run in runs:
        keys.update(dict.fromkeys(k for k, _ in run.overrides))
    return [k for k in keys if len({_comparable(used(run, k)) for run in runs}) > 1]


def label(run: Run, keys: list[str]) -> str:
    """The run named by its own overrides of the keys that tell the runs apart."""
    values = dict(run.overrides)
    own = " ".join(f"{k}={short(values[k])}" for k in keys if k in values)
    return own or ("(shared overrides only)" if run.overrides else "(defaults)")


LONGEST = 48  # characters of a label in a plot: a search's sampled floats run past it


def plot_labels(runs: list[Run], keys: list[str]) -> dict[str, str]:
    """Each run's label for a plot (by run name): label(), shortened from the middle past LONGEST
    characters, and numbered (2), (3), ... in the table's order where runs would share one."""
    labels: dict[str, str] = {}
    seen: dict[str, int] = {}
    for run in runs:
        text = middle(label(run, keys), LONGEST)
        seen[text] = seen.get(text, 0) + 1
        labels[run.name] = text if seen[text] == 1 else f"{text} ({seen[text]})"
    return labels


def middle(text: str, longest: int) -> str:
    """`text` with its middle cut to an ellipsis, to `longest` characters: both ends tell runs apart.
    Its first and last overrides whole where they fit, else a cut through them."""
    if len(text) <= longest:
        return text
    first, last = text.split(" ")[0], text.split(" ")[-1]
    if len(first) + len(last) + 3 <= longest:
        return f"{first} … {last}"
    head = (longest - 1) // 2
    return f"{text[:head]}…{text[len(text) - (longest - 1 - head) :]}"


def legend(runs: list[Run], labels: Mapping[str, str], keys: list[str], search: dict[str, Any] | None) -> list[str]:
    """The lines under the plots: each shortened label with every override of its run, and each of
    a search's trials with its parameters."""
    lines = [
        f"{labels[run.name]}: {' '.join(f'{k}={v}' for k, v in run.overrides)}"
        for run in runs
        if len(label(run, keys)) > LONGEST
    ]
    for trial in (search or {}).get("trials") or []:
        params = " ".join(f"{k}={short(str(v))}" for k, v in (trial.get("params") or {}).items())
        state = "" if trial.get("state") == "COMPLETE" else f" ({trial.get('state', '?').lower()})"
        lines.append(f"trial {trial['number']}: {params}{state}")
    return lines


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
    manifests = any(r.manifest for r in runs)
    header = [
        *extra,
        "strategy",
        "devices",
        "model",
        "dataset",
        "batch",
        SAMPLES_PER_S,
        "speed-up",
        "efficiency",
        "val acc",
        "best acc",
        *objectives,
        "state MB/rank",
        "peak MB/device",
        *(MANIFEST_COLUMNS if manifests else ()),
        "run",
    ]
    align = [*("---" for _ in extra), "---", "---:", "---", "---", *("---:" for _ in range(8 + len(objectives)))]
    align += ["---"] * (len(header) - len(align))
    lines = [f"| {' | '.join(header)} |", f"| {' | '.join(align)} |"]
    for row in table:
        r = row.run
        cells = [
            *(short(used(r, k)) for k in extra),
            r.strategy,
            str(r.devices),
            r.model,
            r.dataset,
            _or_dash(r.batch_size, "{}"),
            f"{r.samples_per_s:,.0f}",
            _or_dash(row.speedup, "{:.2f}×"),
            _or_dash(row.efficiency, "{:.0%}"),
            f"{r.val_acc:.2%}",
            f"{r.best_val_acc:.2%}",
            *(_or_dash(r.objective_value if r.objective == o else None, "{:.4g}") for o in objectives),
            _or_dash(r.state_mb_per_rank, "{:,.1f}"),
            _or_dash(r.peak_memory_mb, "{:,.0f}"),
            *(manifest_cells(r.manifest) if manifests else []),
            r.name,
        ]
        lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines)


MANIFEST_COLUMNS = ("commit", "torch")  # from each run's manifest.json, where any run has one


def manifest_cells(manifest: Mapping[str, Any]) -> list[str]:
    """The code a run trained with (its commit, + where the tree was dirty: manifest.diff) and its torch."""
    commit = manifest.get("commit")
    code = f"{commit[:9]}{'+' if manifest.get('dirty') else ''}" if commit else "—"
    return [code, manifest.get("torch") or "—"]


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
    import matplotlib.pyplot as plt

    fig = figure(table, search)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def figure(table: list[Row], search: dict[str, Any] | None = None) -> Any:
    """Scaling panels when devices vary, else the optimised metric per configuration; accuracy against
    wall time; a search's metric over its trials; under them, the legend()."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a file is the point
    import matplotlib.pyplot as plt

    runs = [row.run for row in table]
    keys = swept_keys(runs)
    devices_vary = len({r.devices for r in runs}) > 1
    panels = (3 if devices_vary else 2) + (search is not None)
    if devices_vary:  # a line per configuration, named by what it is apart from its device count
        keys = [k for k in keys if k not in DEVICE_KEYS | LAYOUT_KEYS]
        first: dict[tuple[Any, ...], Run] = {}
        for run in runs:
            first.setdefault(run.identity, run)
        labelled = list(first.values())
    else:
        labelled = runs
    labels = plot_labels(labelled, keys)
    width = 5.5 * panels
    notes = [
        wrapped
        for line in legend(labelled, labels, keys, search)  # ~14 monospace characters an inch
        for wrapped in textwrap.wrap(line, int(width * 14) - 4, subsequent_indent="    ")
    ]
    notes_inches = 0.15 * len(notes) + 0.2 if notes else 0.0
    fig, axes = plt.subplots(1, panels, figsize=(width, 4.8 + notes_inches), squeeze=False)
    axes = list(axes[0])
    if devices_vary:
        _scaling(axes[0], axes[1], table, labels, keys)
    else:
        _objective_per_configuration(axes[0], runs, labels)
    _accuracy_vs_wall_time(axes[2 if devices_vary else 1], runs, labels, annotate=not devices_vary)
    if search is not None:
        _search_trials(axes[-1], search)
    for ax in axes:
        ax.grid(alpha=0.3)
    below = notes_inches / (4.8 + notes_inches)  # the figure's share under the plots, for the legend
    fig.tight_layout(rect=(0, below, 1, 1))
    if notes:
        fig.text(
            0.01, below - 0.1 / (4.8 + notes_inches), "\n".join(notes), va="top", family="monospace", fontsize="small"
        )
    return fig


def _scaling(throughput: Any, efficiency: Any, table: list[Row], labels: Mapping[str, str], keys: list[str]) -> None:
    """Throughput and efficiency against devices, one line per configuration, labelled as its first run."""
    series: dict[tuple[Any, ...], list[Row]] = {}
    for row in table:
        series.setdefault(row.run.identity, []).append(row)
    for points in series.values():
        name = labels[points[0].run.name] if keys else points[0].run.strategy
        points = sorted(points, key=lambda row: row.run.devices)
        devices = [row.run.devices for row in points]
        (line,) = throughput.plot(devices, [row.run.samples_per_s for row in points], "o-", label=name)
        scaled = [(row.run.devices, row.efficiency) for row in points if row.efficiency is not None]
        if scaled:
            efficiency.plot(*zip(*scaled), "o-", color=line.get_color(), label=name)
    efficiency.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ticks = sorted({row.run.devices for row in table})
    for ax, title, ylabel in (
        (throughput, "Throughput", SAMPLES_PER_S),
        (efficiency, "Scaling efficiency vs 1 device", "speed-up / devices"),
    ):
        ax.set(title=title, xlabel="devices", ylabel=ylabel, xticks=ticks)
        ax.set_ylim(bottom=0)  # from zero, so a 10 % gain looks like one
    throughput.legend(fontsize="small")


def _objective_per_configuration(ax: Any, runs: list[Run], labels: Mapping[str, str]) -> None:
    objective = runs[0].objective if len({r.objective for r in runs}) == 1 else "best_val_acc"
    values = [r.objective_value if r.objective == objective else r.best_val_acc for r in runs]
    positions = range(len(runs))
    ax.barh(positions, [v if v is not None else 0.0 for v in values], color="tab:blue")
    ax.set_yticks(positions, [labels[r.name] for r in runs], fontsize="small")
    ax.invert_yaxis()  # first run on top, as in the table
    ax.set(title=f"{objective} per configuration", xlabel=objective)


def _accuracy_vs_wall_time(ax: Any, runs: list[Run], labels: Mapping[str, str], annotate: bool) -> None:
    ax.scatter([r.wall_s for r in runs], [r.best_val_acc for r in runs], color="tab:blue")
    if annotate:
        times = [r.wall_s for r in runs]
        middle_s = (min(times) + max(times)) / 2
        for r in runs:
            left = r.wall_s > middle_s  # a label runs towards the middle, not off the right edge
            ax.annotate(
                labels[r.name],
                (r.wall_s, r.best_val_acc),
                fontsize="x-small",
                ha="right" if left else "left",
                xytext=(-4 if left else 4, 4),
                textcoords="offset points",
            )
        ax.margins(x=0.1, y=0.1)
    ax.set(title="Accuracy vs wall time", xlabel="wall time (s)", ylabel="best val accuracy")


def _search_trials(ax: Any, search: dict[str, Any]) -> None:
    """Each complete trial's value by trial number, the best so far as a step line, the best trial ringed."""
    from matplotlib.ticker import MaxNLocator

    metric = search.get("metric", "value")
    done = [(t["number"], t["value"]) for t in search.get("trials") or [] if t.get("state") == "COMPLETE"]
    if done:
        numbers, values = zip(*done)
        better = max if search.get("direction") == "maximize" else min
        best_so_far = [better(values[: i + 1]) for i in range(len(values))]
        ax.plot(numbers, values, "o", label="trial")
        ax.step(numbers, best_so_far, where="post", label="best so far")
        if search.get("best_trial") is not None:
            ax.plot(
                [search["best_trial"]],
                [search["best_value"]],
                "o",
                markersize=12,
                fillstyle="none",
                color="tab:red",
                label=f"best: trial {search['best_trial']}",
            )
        ax.legend(fontsize="small")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # trials are whole numbers: no tick at 0.5
    ax.set(title=f"{metric} over the trials (parameters: below)", xlabel="trial (its job's number)", ylabel=metric)


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

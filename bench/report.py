"""Summarise a sweep: python -m bench.report <sweep or outputs dir> [--png PATH].

Reads every run's metrics.json under the directory and its record: every option it used, flat, and
its model summary (hparams.json, which train.py writes; for a run from before it, the config and
group choices in .hydra/), and the overrides that made it (.hydra/overrides.yaml). Prints a markdown
table with a column per key whose value is not the same in every run, whichever way it came to
differ (a group's defaults, an interpolation, an override), the commit and torch it trained with
(its manifest.json), speed-up and scaling efficiency where
runs differ in device count and nothing else, and, for an hparams_search, the best trial from
optimization_results.yaml. report.png (in the directory, unless --png says where) holds the plots
that fit: scaling against devices when devices vary, else the optimised metric per configuration;
accuracy against wall time; the metric over a search's trials. A run is labelled by the values it
used of the overridden keys that differ, after its sweep's dir where the runs come from several;
a label is shortened from the middle where long, with a legend under the plots that gives each
shortened label's overrides and each trial's parameters.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from config.hparams import differing
from config.paths import make_folder
from config.setup import job_order
from errors import ConfigError
from training.loggers.tensorboard import HPARAM_METRICS
from training.manifest import read_manifest

# Overrides that only change how many devices train: runs differing in these alone compare in speed.
DEVICE_KEYS = frozenset({"trainer.devices", "trainer.gpus", "trainer.num_nodes"})
# Overrides that pick a strategy and a device count together (conf/parallelism, swept by
# sweep=strategies): metrics.json records both, so a run's identity keeps its strategy without them.
LAYOUT_KEYS = frozenset({"parallelism"})
# Keys the table already shows in a column of its own.
SHOWN = (
    frozenset({"strategy", "strategy.name", "model", "dataset", "dataset.name", "trainer.batch_size"})
    | DEVICE_KEYS
    | LAYOUT_KEYS
)
# A run's flat records in its dir, joined into one (a later file's key wins): what runs are compared by.
RECORDS = ("hparams.json",)
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
    # Every option the run used, flat ({dotted key: value}), and its model summary: its RECORDS.
    record: Mapping[str, Any] = field(default_factory=dict, compare=False)
    sweep: str | None = None  # the dir of the sweep it is a job of, relative to the directory reported on
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
    for path in sorted(root.rglob("metrics.json"), key=lambda p: job_order(str(p.parent.relative_to(root)))):
        try:
            metrics = json.loads(path.read_text())
            if "weights" in metrics:  # trainer.test_only's: what it evaluated, with no training to compare
                print(f"skipped {path}: a trainer.test_only evaluation, not a training run", file=sys.stderr)
                continue
            runs.append(_run(str(path.parent.relative_to(root)), metrics, path.parent, root))
        except (json.JSONDecodeError, KeyError) as e:
            print(f"skipped {path}: not a metrics.json written by train.py ({type(e).__name__}: {e})", file=sys.stderr)
    # A run that started (its manifest.json) but wrote no metrics.json: a comparison without it must say so.
    for path in sorted(root.rglob("manifest.json"), key=lambda p: job_order(str(p.parent.relative_to(root)))):
        if not (path.parent / "metrics.json").exists():
            print(
                f"skipped {path.parent}: no metrics.json, the run has not finished (it failed, was stopped or "
                "killed, or still runs: its train.log says which)",
                file=sys.stderr,
            )
    return runs


def _run(name: str, m: dict[str, Any], run_dir: Path, root: Path) -> Run:
    overrides = read_overrides(run_dir)
    record = read_record(run_dir, overrides)
    objective = record.get("optimized_metric") or "best_val_acc"
    sweep = run_dir.parent
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
        overrides=overrides,
        objective=objective,
        objective_value=float(m[objective]) if isinstance(m.get(objective), (int, float)) else None,
        record=record,
        sweep=str(sweep.relative_to(root)) if (sweep / "multirun.yaml").is_file() else None,
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


def read_record(run_dir: Path, overrides: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    """The run's RECORDS joined, nested keys dotted; for a run that kept none, what its .hydra/ says:
    {dotted key: value} from config.yaml (unresolved: an interpolation is its text) and {group:
    option} from hydra.yaml, each overridden key as its override typed it. Empty if it kept nothing."""
    record: dict[str, Any] = {}
    for name in RECORDS:
        if (run_dir / name).is_file():
            _flatten(json.loads((run_dir / name).read_text()), "", record)
    if record:
        return record
    hydra_record = run_dir / ".hydra"
    if (hydra_record / "config.yaml").is_file():
        _flatten(yaml.safe_load((hydra_record / "config.yaml").read_text()) or {}, "", record)
    if (hydra_record / "hydra.yaml").is_file():
        hydra = yaml.safe_load((hydra_record / "hydra.yaml").read_text()) or {}
        choices = hydra.get("hydra", {}).get("runtime", {}).get("choices") or {}
        record.update((group, option) for group, option in choices.items() if option is not None)
    record.update((key, _typed(value)) for key, value in overrides)
    return record


def _typed(value: str) -> Any:
    """An override's value as the config would hold it (1, 0.05, true, sgd)."""
    try:
        typed = yaml.safe_load(value)
    except yaml.YAMLError:
        return value
    return json.dumps(typed) if isinstance(typed, list) else typed if isinstance(typed, (bool, int, float)) else value


def _flatten(node: Mapping[str, Any], prefix: str, into: dict[str, Any]) -> None:
    for key, value in node.items():
        if isinstance(value, Mapping):
            _flatten(value, f"{prefix}{key}.", into)
        elif value is not None:
            into[f"{prefix}{key}"] = json.dumps(value) if isinstance(value, list) else value


def used(run: Run, key: str) -> Any:
    """What the run used for `key` (for a group, the option Hydra picked); None where it kept no record of it."""
    return run.record.get(key)


def cell(value: Any) -> str:
    """A value as a config spells it (true, null), a float to 4 significant digits (a search's
    sampled 0.015171717849735478: 0.01517); "—" where the run has none."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return json.dumps(value)
    return f"{value:.4g}" if isinstance(value, float) else short(str(value))


def _state_mb(m: dict[str, Any]) -> float | None:
    """What the fullest rank holds for training, from its local shards (fsdp: about 1/N of ddp's)."""
    parts = [m.get(key) for key in ("param_bytes_per_rank", "grad_bytes_per_rank", "optimizer_bytes_per_rank")]
    if not all(isinstance(part, list) and part for part in parts):
        return None  # written before metrics.json recorded them
    return max(sum(ranks) for ranks in zip(*parts)) / 1e6


def _largest(peak: float | list[float] | None) -> float | None:
    """One figure per device, or one for all: the largest is the one that must fit."""
    return max(peak, default=None) if isinstance(peak, list) else peak


def differing_keys(runs: list[Run]) -> list[str]:
    """The keys whose value, as each run's record holds it, is not the same in every run."""
    return list(differing([run.record for run in runs]))


def swept_keys(runs: list[Run]) -> list[str]:
    """The differing keys that some run set on its command line, in command-line order: what a label names."""
    differs = set(differing_keys(runs))
    overridden = dict.fromkeys(key for run in runs for key, _ in run.overrides)
    return [key for key in overridden if key in differs]


def several_sweeps(runs: list[Run]) -> bool:
    """Runs from more than one sweep (runs of none together count as one)."""
    return len({run.sweep for run in runs}) > 1


def label(run: Run, keys: list[str], by_sweep: bool = False) -> str:
    """The run named by the values it used of `keys` (swept_keys), after its sweep's dir where
    `by_sweep` (runs from several sweeps: a run of none is its own); its dir where nothing else tells it."""
    values = " ".join(f"{key}={cell(used(run, key))}" for key in keys)
    if not by_sweep:
        return values or run.name
    sweep = run.sweep if run.sweep is not None else run.name
    return f"{sweep}: {values}" if values else sweep


LINE, LINES = 40, 3  # a label in a plot: characters a line, and lines at most
LONGEST = LINE * LINES


def plot_labels(runs: list[Run], keys: list[str], by_sweep: bool = False) -> dict[str, str]:
    """Each run's label for a plot (by run name): label(), shortened from the middle past LONGEST
    characters, then wrapped to lines of LINE; where two runs' would be the same, each after its dir."""
    labels = {run.name: middle(label(run, keys, by_sweep), LONGEST) for run in runs}
    repeated = {text for text in labels.values() if list(labels.values()).count(text) > 1}
    unique = {name: middle(f"{name}: {text}", LONGEST) if text in repeated else text for name, text in labels.items()}
    return {name: "\n".join(textwrap.wrap(text, LINE)) for name, text in unique.items()}


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


def legend(
    runs: list[Run], labels: Mapping[str, str], keys: list[str], search: dict[str, Any] | None, by_sweep: bool = False
) -> list[str]:
    """The lines under the plots: each shortened label with every override of its run, and each of
    a search's trials with its parameters."""
    lines = [
        f"{labels[run.name]}: {' '.join(f'{k}={v}' for k, v in run.overrides)}"
        for run in runs
        if labels[run.name].replace("\n", " ") != label(run, keys, by_sweep)
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


MANIFEST_COLUMNS = ("commit", "torch")  # from each run's manifest.json, where any run has one


def manifest_cells(manifest: Mapping[str, Any]) -> list[str]:
    """The code a run trained with (its commit, + where the tree was dirty: manifest.diff) and its torch."""
    commit = manifest.get("commit")
    code = f"{commit[:9]}{'+' if manifest.get('dirty') else ''}" if commit else "—"
    return [code, manifest.get("torch") or "—"]


def markdown(table: list[Row]) -> str:
    runs = [row.run for row in table]
    extra = [k for k in differing_keys(runs) if k not in SHOWN]
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
            *(cell(used(r, k)) for k in extra),
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


def _or_dash(value: Any, fmt: str) -> str:
    return "—" if value is None else fmt.format(value)


def load_search(root: Path) -> dict[str, Any] | None:
    """The sweeper's own account of a search (best trial, every trial's value); None if this is no search."""
    path = root / SEARCH_RESULTS
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def search_summary(search: dict[str, Any]) -> str:
    metric = search.get("metric", "value")
    # What ended each trial (pruned ones count towards n_trials, failed ones do not), as the results list them.
    states = Counter(trial.get("state") for trial in search.get("trials") or [])
    ended = "".join(
        f", {states[state]} {said}" for state, said in (("PRUNED", "pruned"), ("FAIL", "failed")) if states[state]
    )
    lines = [
        f"Search {search.get('study_name', '?')}: {search.get('complete', '?')} of {search.get('n_trials', '?')} "
        f"trials complete{ended}, {search.get('direction', '?')} {metric}."
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
    fig.savefig(path, dpi=100, bbox_inches="tight")  # the legend beside the last plot and the notes under them
    plt.close(fig)


# A bar of the per-configuration plot: what its label's lines in small print take, and a gap to the next.
LINE_INCHES, BAR_GAP_INCHES = 0.16, 0.1


def figure(table: list[Row], search: dict[str, Any] | None = None) -> Any:
    """Scaling panels when devices vary, else the optimised metric per configuration; a search's
    metric over its trials; accuracy against wall time, its runs in a legend beside it; under them,
    the legend()."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a file is the point
    import matplotlib.pyplot as plt

    runs = [row.run for row in table]
    keys, by_sweep = swept_keys(runs), several_sweeps(runs)
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
    labels = plot_labels(labelled, keys, by_sweep)
    widest = max(len(line) for text in labels.values() for line in text.splitlines())
    # The per-configuration plot is as wide as its labels need (~14 characters an inch in small print) besides its bars.
    widths = [5.5] * panels if devices_vary else [3.0 + widest / 14, *([5.5] * (panels - 1))]
    width = sum(widths)
    notes = [
        wrapped
        for line in legend(labelled, labels, keys, search, by_sweep)  # ~14 monospace characters an inch
        for wrapped in textwrap.wrap(line, int(width * 14) - 4, subsequent_indent="    ")
    ]
    # The bars are evenly spaced: each as tall as the label of the most lines needs.
    lines = 0 if devices_vary else max(1 + text.count("\n") for text in labels.values())
    height = max(4.8, 1.5 + (LINE_INCHES * lines + BAR_GAP_INCHES) * len(runs))
    fig, axes = plt.subplots(1, panels, figsize=(width, height), squeeze=False, gridspec_kw={"width_ratios": widths})
    axes = list(axes[0])
    if devices_vary:
        _scaling(axes[0], axes[1], table, labels, keys)
    else:
        _objective_per_configuration(axes[0], runs, labels)
    if search is not None:
        _search_trials(axes[-2], search)
    _accuracy_vs_wall_time(axes[-1], runs, labels, legend=not devices_vary)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    if notes:  # under the plots, however many lines: the saved figure grows to hold them
        fig.text(0.01, 0, "\n".join(notes), va="top", family="monospace", fontsize="small")
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
    colours = [_style(i)[0] for i in positions]  # each run's in the accuracy plot too
    ax.barh(positions, [v if v is not None else 0.0 for v in values], color=colours)
    ax.set_yticks(positions, [labels[r.name] for r in runs], fontsize="small")
    ax.set_ylim(len(runs) - 0.5, -0.5)  # first run on top, as in the table
    ax.set(title=f"{objective} per configuration", xlabel=objective)


MARKERS = "osD^v<>ph*"


def _style(i: int) -> tuple[str, str]:
    """The i-th run's colour and marker: matplotlib's ten colours C0..C9, then the next marker."""
    return f"C{i % 10}", MARKERS[i // 10 % len(MARKERS)]


def _accuracy_vs_wall_time(ax: Any, runs: list[Run], labels: Mapping[str, str], legend: bool) -> None:
    """One point per run; with `legend`, each its own colour and marker, named beside the plot
    (labels on the plot would print over each other where runs end alike)."""
    if not legend:
        ax.scatter([r.wall_s for r in runs], [r.best_val_acc for r in runs], color="tab:blue")
    else:
        for i, r in enumerate(runs):
            colour, marker = _style(i)
            ax.scatter([r.wall_s], [r.best_val_acc], color=colour, marker=marker, label=labels[r.name])
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize="small", frameon=False)
        ax.margins(x=0.1, y=0.1)
    ax.set(title="best_val_acc vs wall time", xlabel="wall time (s)", ylabel="best_val_acc")


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
    ax.set(title=f"{metric} over the trials (parameters below)", xlabel="trial (its job's number)", ylabel=metric)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="a sweep dir (multirun/<date>/<time>) or outputs/")
    parser.add_argument("--png", type=Path, help="where to write the plot (default: report.png in the directory)")
    args = parser.parse_args(argv)
    png = args.png or args.directory / "report.png"
    runs = load_runs(args.directory) if args.directory.is_dir() else []
    if not runs:
        print(
            f"error: no metrics.json under {args.directory}; point at a sweep dir such as multirun/<date>/<time>, "
            "or run one first: python train.py -m sweep=scaling",
            file=sys.stderr,
        )
        return 2
    try:
        make_folder(png.parent, f"--png={png}")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    table = rows(runs)
    search = load_search(args.directory)
    print(markdown(table))
    if search is not None:
        print(f"\n{search_summary(search)}")
    plot(table, png, search)
    where = "" if args.png else " (in the directory reported on; --png PATH writes it elsewhere)"
    print(f"\nplot: {png}{where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

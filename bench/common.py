"""What every benchmark shares: run `train.py` as a user would, time commands, print tables."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# For benchmarks whose figures are taken after start-up (throughput, memory): their ranks fork from
# one server that imported torch once, so a run spends less time starting, and measures the same.
FORKSERVER_RANKS = "launcher.start_method=forkserver"
# The line bench/first_step.py's callback prints once rank 0's first optimizer step is done, and the
# override that adds that callback to a train.py run: here, so that a benchmark clocking the line
# does not import torch itself (the callback's module does).
FIRST_STEP = "first optimizer step done"
FIRST_STEP_CALLBACK = "+callbacks.first_step._target_=bench.first_step.FirstStep"


def train(*overrides: str) -> dict:
    """Run `python train.py <overrides>` in a fresh run dir; return its metrics.json."""
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = [sys.executable, "train.py", f"hydra.run.dir={run_dir}", "trainer.progress_bar=false", *overrides]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"train.py {' '.join(overrides)} failed:\n{done.stderr[-3000:]}")
        return json.loads((Path(run_dir) / "metrics.json").read_text())


def python_json(*args: str) -> dict:
    """Run `python <args>` (a baseline script printing one JSON line); return what it printed."""
    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"python {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def wall(cmd: Sequence[str]) -> float:
    """Seconds one command takes from start to exit."""
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - start


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def per_round(figures: Sequence[float], baseline: Sequence[float]) -> list[float]:
    """Each round's ratio: systems that ran in the same round saw the same machine."""
    return [a / b for a, b in zip(figures, baseline)]


def spread(values: Sequence[float]) -> str:
    """min–max of the rounds: runs on a shared machine move between rounds, so this says how far their median holds."""
    return f"{min(values):.3f}–{max(values):.3f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table, ready to paste into BENCHMARKS.md."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def verdict(value: float, target: float, higher_is_better: bool = True) -> str:
    met = value >= target if higher_is_better else value <= target
    return "meets target" if met else "MISSES target"


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)

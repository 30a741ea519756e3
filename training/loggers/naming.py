"""What a job is called where several runs sit side by side (W&B, MLflow): its overrides, its sweep,
and the id that keeps a resumed job in the run it started."""

from __future__ import annotations

from pathlib import Path

from config.schema import RunConfig


def run_name(job: RunConfig) -> str:
    """The job's command-line overrides as they were typed (`optimizer.lr=0.01 trainer.batch_size=32`):
    what tells a sweep's jobs apart. A run without any is called by its dir (`18-55-00`)."""
    return " ".join(f"{key}={value}" for key, value in job.swept.items()) or job.run_dir.name


def sweep_name(job: RunConfig) -> str | None:
    """The sweep's dir below the sweeps' root (`2026-11-26/18-55-00`, `search/digits`); None for a single run."""
    return "/".join(job.sweep_dir.parts[-2:]) if job.sweep_dir is not None else None


def trial_name(job: RunConfig) -> str:
    """A sweep's job as TensorBoard's HParams tab names its row (its Trial ID), so that the rows of
    several sweeps under one --logdir read apart: what its overrides set among the keys its sweep's
    jobs differ in, then its sweep and its number there (`model=mnist_net optimizer=sgd ·
    2026-12-06/03-12-44 #2`); "" for a single run, which the tab names by its dir."""
    if job.sweep_dir is None:
        return ""
    differs = " ".join(f"{key}={_short(value)}" for key, value in job.swept.items() if key in job.varied)
    number = job.run_dir.name.split("_", 1)[0]  # config.setup.job_dir names it so
    return f"{differs or run_name(job)} · {sweep_name(job)} #{number}"


def _short(value: object) -> str:
    """A search's sampled float to 4 significant digits, as its dir names it."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def kept_id(path: Path) -> str | None:
    """The id of the backend's run that an earlier process of this run dir kept in `path`: a resume
    or a requeued job continues that run."""
    return path.read_text().strip() if path.is_file() else None


def keep_id(path: Path, run_id: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(run_id + "\n")
    return run_id

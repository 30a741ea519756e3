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


def kept_id(path: Path) -> str | None:
    """The id of the backend's run that an earlier process of this run dir kept in `path`: a resume
    or a requeued job continues that run."""
    return path.read_text().strip() if path.is_file() else None


def keep_id(path: Path, run_id: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(run_id + "\n")
    return run_id

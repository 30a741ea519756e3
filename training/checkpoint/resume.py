"""Which checkpoint a run continues: decided once, before launch (`decide_resume`, in the pre-flight,
which opens the file and checks it can continue this run), carried to every rank in the RunConfig,
and opened once more by each rank at restore (`open_resume`), where every rank confirms it sees that
very file, or the run stops in one line saying the run dir is not shared. A process that decided and
then restores (a torchrun or SLURM rank, a single run) opens it once."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from torch import nn

from config.schema import ResumePoint, SchedulerOptions, TrainerConfig
from distributed.collectives import all_gather_object, barrier
from distributed.context import DistContext
from errors import ConfigError
from training.checkpoint.files import FIX, load_checkpoint, no_such_checkpoint, run_dir_of, trained_config

_REQUIRED = ("model", "optimizer", "scheduler", "epoch", "step", "best")
NOT_SHARED = "the run dir is not shared between nodes"
_SHARE_FIX = "put hydra.run.dir on a filesystem that every node mounts (docs/clusters.md)"

# The checkpoint this process decided on, as it opened it (path -> (point, contents)): restored from
# without being read again. A sharded one is described, not held: DCP reads its shards into the model.
_opened: dict[Path, tuple[ResumePoint, dict[str, Any]]] = {}


def find_resume(resume: str | None, run_dir: Path, env: Mapping[str, str] = os.environ) -> Path | None:
    """`auto`: this run dir's last.pt if a previous attempt left one, else start fresh; a run dir: its
    last.pt; else the checkpoint named. In a job that SLURM or torchrun restarted (`is_restart`),
    null means auto: the requeued job, of slurm/train.sbatch or of hydra/launcher=submitit_slurm
    alike, or torchrun's new worker group, goes on from where it stopped."""
    if resume is None and is_restart(run_dir, env):
        resume = "auto"
    if resume is None:
        return None
    if resume == "auto":
        last = run_dir / "checkpoints" / "last.pt"
        return last if last.exists() else None
    path = Path(resume)
    # A run dir: its last.pt, as `auto` takes in its own (predict.py and export.py take run dirs too).
    run_dir = run_dir_of(path)
    return run_dir / "checkpoints" / "last.pt" if run_dir is not None else path


# In a run dir: the rendezvous id (TORCHELASTIC_RUN_ID) of the torchrun job that trains there.
TORCHRUN_JOB = "torchrun_run_id"


def is_restart(run_dir: Path | None, env: Mapping[str, str] = os.environ) -> bool:
    """Whether this start continues the job that trains in `run_dir`: SLURM requeued it
    (SLURM_RESTART_COUNT), or torchrun started it again (--max-restarts, or a node that joined).
    torchrun's own count, TORCHELASTIC_RESTART_COUNT, is each agent's: a node that joins later
    counts 0 where the others count 1, and its ranks would refuse the last.pt the others resume.
    Its rendezvous id is one for every node and every restart of the job: a start is a restart when
    its id is the one its run dir recorded (`record_torchrun_job`). `--standalone` draws a fresh id
    per command; an `--rdzv-id` given again names the same job."""
    if int(env.get("SLURM_RESTART_COUNT") or 0) > 0:
        return True
    run_id = env.get("TORCHELASTIC_RUN_ID", "none")
    if run_id == "none" or run_dir is None:
        return False
    try:
        return (run_dir / TORCHRUN_JOB).read_text() == run_id
    except OSError:
        return False


def record_torchrun_job(run_dir: Path, env: Mapping[str, str] = os.environ) -> None:
    """Under torchrun, at a start that may train in `run_dir`: the job it belongs to, for
    `is_restart`. Rank 0 writes it, renamed into place: a rank that reads it meanwhile reads it whole."""
    run_id = env.get("TORCHELASTIC_RUN_ID", "none")
    if run_id == "none" or env.get("RANK", "0") != "0":
        return
    tmp = run_dir / f".{TORCHRUN_JOB}.tmp"
    tmp.write_text(run_id)
    os.replace(tmp, run_dir / TORCHRUN_JOB)


def decide_resume(
    settings: TrainerConfig,
    run_dir: Path | None,
    *,
    model: Callable[[], nn.Module],
    scheduler: Mapping[str, Any],
    warmup_epochs: int,
    weights: str | None,
    restores_here: bool,
    sweep_job: bool,
) -> ResumePoint | None:
    """The checkpoint this run continues (None: afresh), opened and checked once: refuse one that
    cannot continue this run, and never overwrite a run's last.pt; a start let train in `run_dir`
    records its torchrun job there (`is_restart`). `model` builds the run's model
    (called only to compare a checkpoint with it); `scheduler`: the scheduler node as configured;
    `weights`: model.weights; `restores_here`: this process trains (it is a rank), so it keeps what
    it read for the restore; `sweep_job`: one job of a `-m` sweep, whose dir hydra.sweep.dir names."""
    resume, test_only = settings.resume, settings.test_only
    path = find_resume(resume, run_dir) if run_dir is not None or resume != "auto" else None
    point = None
    if path is not None:
        if not path.exists():
            raise no_such_checkpoint(path)
        if path.is_dir():  # strategy=fsdp's sharded last.pt, checked from its metadata and train state
            from training.checkpoint import sharded  # late: DCP is slow to import (BENCHMARKS.md: Start-up)

            checkpoint = sharded.describe(path)
        else:
            checkpoint = load_checkpoint(path, mmap=True)
        check_resumable(checkpoint, model(), path)
        warmed = isinstance(checkpoint["scheduler"], dict) and "last_step" in checkpoint["scheduler"]  # a Warmup's
        if not test_only and warmed != bool(warmup_epochs):
            raise ConfigError(
                f"trainer.resume={resume} trained {'with' if warmed else 'without'} a warmup and cannot continue "
                f"{'without' if warmed else 'with'} one; resume with the scheduler.warmup_epochs it trained with"
            )
        if not test_only:
            _check_schedule(resume, trained_config(checkpoint), scheduler)
        point = ResumePoint(path, int(checkpoint["step"]), _size(path))
        if restores_here and not path.is_dir():
            _opened[path] = (point, checkpoint)
    elif test_only and weights is None and settings.init_from is None:
        raise ConfigError(
            f"trainer.test_only=true evaluates trained weights, but trainer.resume={resume} names no checkpoint; "
            "give trainer.resume=<checkpoint>, trainer.init_from=<run dir> or model.weights=<file>"
        )
    last = run_dir / "checkpoints" / "last.pt" if run_dir is not None else None
    if not test_only and last is not None and last.exists() and (path is None or path.resolve() != last.resolve()):
        if sweep_job:  # the job's dir is the sweep's, named by the job: the sweep's dir is the user's to change
            raise ConfigError(
                f"{run_dir.name}, a job of hydra.sweep.dir={run_dir.parent}, already holds checkpoints/last.pt; "
                "continue the sweep with trainer.resume=auto or give it another hydra.sweep.dir"
            )
        raise ConfigError(
            f"hydra.run.dir={run_dir} already holds checkpoints/last.pt; continue it with trainer.resume=auto "
            "or train in another hydra.run.dir"
        )
    if run_dir is not None and not test_only:
        record_torchrun_job(run_dir)
    return point


def open_resume(point: ResumePoint | None, run_dir: Path, ctx: DistContext) -> dict[str, Any] | None:
    """The checkpoint `point` names, as this rank reads it (None: a sharded one, which DCP reads into
    the model; or none to resume). Every rank must see the very file rank 0 decided on (its step and
    size), or every rank stops with the same one-line error: a rank that started afresh while the
    others resumed would train other weights, or wait in a collective they never reach. Every rank
    calls it."""
    checkpoint, seen = None, None
    if point is not None and _listed(point.path):
        if point.path.is_dir():
            seen = _sharded_identity(point.path)
        else:
            kept = _opened.pop(point.path, None)
            checkpoint = kept[1] if kept is not None and kept[0] == point else load_checkpoint(point.path, mmap=True)
            seen = (int(checkpoint.get("step", -1)), _size(point.path))
    if ctx.world_size > 1:
        mine = str(point.path) if point is not None else None
        views = all_gather_object((socket.gethostname(), mine, seen), ctx)
        _, decided, identity = views[0]
        for rank, (host, path, their) in enumerate(views):
            if (path, their) != (decided, identity):
                what = f"resumes from {decided} ({_describe(identity)})" if decided else "starts afresh"
                where = path or run_dir / "checkpoints" / "last.pt"
                raise ConfigError(
                    f"{NOT_SHARED}: rank 0 {what} but rank {rank} on {host} sees {_describe(their)} at {where}; "
                    f"{_SHARE_FIX}"
                )
    elif point is not None and seen != (point.step, point.size):
        raise ConfigError(
            f"trainer.resume={point.path} changed after the pre-flight read it (step {point.step}, {point.size} "
            f"bytes; now {_describe(seen)}); run again to resume from it as it is now"
        )
    return checkpoint


def check_resumable(checkpoint: Any, model: nn.Module, path: Path) -> None:
    """A train.py checkpoint of this very (unwrapped) model; name the first tensor that differs, not all."""
    missing = [key for key in _REQUIRED if not isinstance(checkpoint, dict) or key not in checkpoint]
    if missing:
        raise ConfigError(f"trainer.resume={path}: not a train.py checkpoint (no {', '.join(missing)}); {FIX}")
    saved, expected = checkpoint["model"], model.state_dict()
    trained_with = _model_target(checkpoint)
    fix = f"resume with the model it was trained with ({trained_with or 'see its config'})"
    for name, tensor in expected.items():
        if name not in saved:
            raise ConfigError(f"trainer.resume={path}: the checkpoint lacks tensor {name} this model needs; {fix}")
        if saved[name].shape != tensor.shape:
            raise ConfigError(
                f"trainer.resume={path}: tensor {name} has shape {list(saved[name].shape)} in the checkpoint "
                f"but {list(tensor.shape)} in this model; {fix}"
            )
    extra = sorted(set(saved) - set(expected))
    if extra:
        raise ConfigError(f"trainer.resume={path}: the checkpoint has tensor {extra[0]} this model lacks; {fix}")


def _model_target(checkpoint: dict[str, Any]) -> str | None:
    model = (trained_config(checkpoint) or {}).get("model")
    return model.get("_target_") if isinstance(model, dict) else None


def _check_schedule(resume: str | None, trained: Mapping[str, Any] | None, scheduler: Mapping[str, Any]) -> None:
    """The schedule a resume asks for is the one it trained with: loading the scheduler's state puts
    back the saved T_max, step_size, ..., so a run resumed with `trainer.epochs` raised would train
    its extra epochs on a cosine already at lr 0; a warmup of another length would change course
    mid-run."""
    if trained is None or not isinstance(trained.get("scheduler"), dict):  # a checkpoint that does not say
        return
    before = trained["scheduler"]
    ours = [f.name for f in fields(SchedulerOptions)]  # the warmup, before what it changes (T_max)
    keys = sorted({*before, *scheduler}, key=lambda k: (k != "_target_", k not in ours, k))
    key = next((k for k in keys if before.get(k) != scheduler.get(k)), None)
    if key is None:
        return
    epochs = (trained.get("trainer") or {}).get("epochs")
    fix = (
        f"resume with trainer.epochs={epochs}, which T_max follows,"
        if key == "T_max" and epochs is not None
        else "resume with the scheduler it trained with"
    )
    raise ConfigError(
        f"trainer.resume={resume} trained with scheduler.{key}={before.get(key, 'none')}, and this run asks for "
        f"{scheduler.get(key, 'none')}: a resume continues the saved schedule; {fix} or train afresh in a new run dir"
    )


def confirm_shared(made_by_main: Path, ctx: DistContext) -> None:
    """Once rank 0 has made `made_by_main` (the ranks meet first): every rank sees it, or every rank stops
    in one line (a rank that cannot writes where rank 0 never looks). Read from its directory's
    listing, which a network filesystem revalidates, unlike a cached lookup of the name."""
    barrier(ctx)
    seen = all_gather_object((socket.gethostname(), _listed(made_by_main)), ctx)
    for rank, (host, listed) in enumerate(seen):
        if not listed:
            raise ConfigError(
                f"{NOT_SHARED}: rank 0 made {made_by_main} but rank {rank} on {host} cannot see it; {_SHARE_FIX}"
            )


def _listed(path: Path) -> bool:
    try:
        return path.name in os.listdir(path.parent)
    except OSError:
        return False


def _size(path: Path) -> int:
    """A checkpoint's bytes; strategy=fsdp's sharded last.pt: its version's files together."""
    if path.is_dir():
        return sum(f.stat().st_size for f in path.resolve().iterdir() if f.is_file())
    return path.stat().st_size


def _sharded_identity(path: Path) -> tuple[int, int]:
    """(step, bytes) of strategy=fsdp's last.pt, a directory named after its step
    (training/checkpoint/sharded.py), read from the listing alone."""
    step = re.search(r"\.step(\d+)\.", path.resolve().name)
    return (int(step[1]) if step else -1, _size(path))


def _describe(identity: tuple[int, int] | None) -> str:
    return f"step {identity[0]}, {identity[1]} bytes" if identity else "no checkpoint"

"""Checkpoints: plain tensors and primitives, written atomically by rank 0 only."""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from config.schema import ScheduleConfig, TrainerConfig
from distributed.collectives import all_gather_object, barrier
from distributed.context import DistContext
from distributed.strategies import unwrap
from errors import ConfigError

log = logging.getLogger("train")

_REQUIRED = ("model", "optimizer", "scheduler", "epoch", "step", "best")
_FIX = "point trainer.resume at a last.pt or best.pt written by train.py"


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """Write to a temp file, fsync, then rename over `path`: a crash leaves the old file whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    # The rename is durable only once the directory entry is on disk too.
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    drop_unnamed_versions(path)  # an fsdp run's sharded last.pt, now that this file replaced its link


def drop_unnamed_versions(path: Path, named: str | None = None) -> None:
    """Delete strategy=fsdp's sharded versions of `path` (its `last.pt.step120.3fa9c1/` directories)
    but the one `path` names now, if any: once `path` no longer names them nothing reads them."""
    for old in path.parent.glob(f"{path.name}.step*"):
        if old.name != named and old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """weights_only=True: a checkpoint can carry tensors and primitives, never code.

    Read to host memory: load_state_dict copies each tensor to its parameter's device. Read to a
    GPU, the file would be a second model and optimizer beside the first (and under FSDP the whole
    of both on every rank), and Adam's step counts, which optimizer.load_state_dict leaves where
    they were read (torch/optim/optimizer.py), would stay there: a host sync per parameter per step."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ConfigError(f"trainer.resume={path}: no such file; give an existing checkpoint path") from None
    except Exception as e:  # torch raises several types for truncated, corrupt or pickled files
        pickled = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        if pickled:
            raise ConfigError(
                f"trainer.resume={path}: refused, it holds a pickled Python object ({pickled.group(1)}) and "
                f"checkpoints load with weights_only=True; {_FIX}"
            ) from None
        detail = str(e).split("WeightsUnpickler error:")[-1].strip()  # torch's advice comes first
        first_line = detail.splitlines()[0] if detail else type(e).__name__
        raise ConfigError(f"trainer.resume={path}: not a loadable checkpoint ({first_line}); {_FIX}") from None
    return checkpoint


def check_resumable(checkpoint: Any, model: nn.Module, path: Path) -> None:
    """A train.py checkpoint of this very (unwrapped) model; name the first tensor that differs, not all."""
    missing = [key for key in _REQUIRED if not isinstance(checkpoint, dict) or key not in checkpoint]
    if missing:
        raise ConfigError(f"trainer.resume={path}: not a train.py checkpoint (no {', '.join(missing)}); {_FIX}")
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


def trained_config(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """The resolved config the checkpoint's run trained with, if it holds one that parses."""
    text = checkpoint.get("config")
    if not isinstance(text, str):
        return None
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    return config if isinstance(config, dict) else None


def find_resume(resume: str | None, run_dir: Path, env: Mapping[str, str] = os.environ) -> Path | None:
    """`auto`: this run dir's last.pt if a previous attempt left one, else start fresh. In a job that
    SLURM or torchrun restarted (`is_restart`), null means auto: the requeued job, of
    slurm/train.sbatch or of hydra/launcher=submitit_slurm alike, or torchrun's new worker group,
    goes on from where it stopped."""
    if resume is None and is_restart(run_dir, env):
        resume = "auto"
    if resume is None:
        return None
    if resume == "auto":
        last = run_dir / "checkpoints" / "last.pt"
        return last if last.exists() else None
    return Path(resume)


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


def _check_schedule(resume: str | None, trained: Mapping[str, Any] | None, scheduler: Mapping[str, Any]) -> None:
    """The schedule a resume asks for is the one it trained with: loading the scheduler's state puts
    back the saved T_max, step_size, ..., so a run resumed with `trainer.epochs` raised would train
    its extra epochs on a cosine already at lr 0; a warmup of another length would change course
    mid-run."""
    if trained is None or not isinstance(trained.get("scheduler"), dict):  # a checkpoint that does not say
        return
    before = trained["scheduler"]
    ours = [f.name for f in fields(ScheduleConfig)]  # the warmup, before what it changes (T_max)
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


def check_resume(
    trainer: TrainerConfig,
    run_dir: Path | None,
    *,
    model: Callable[[], nn.Module],
    scheduler: Mapping[str, Any],
    warmup_epochs: int,
    weights: str | None,
) -> None:
    """Refuse a checkpoint that cannot continue this run, and never overwrite a run's last.pt; a start
    let train in `run_dir` records its torchrun job there (`is_restart`). `model`
    builds the run's model (called only to compare a checkpoint with it); `scheduler`: the scheduler
    node as configured; `weights`: model.weights."""
    resume, test_only = trainer.resume, trainer.test_only
    path = find_resume(resume, run_dir) if run_dir is not None or resume != "auto" else None
    if path is not None:
        if not path.exists():
            raise ConfigError(f"trainer.resume={resume}: no such file; give an existing checkpoint path")
        if path.is_dir():  # strategy=fsdp's sharded last.pt, checked from its metadata and train state
            if test_only:  # training.evaluation reads one whole file; strategy=fsdp writes best.pt as one
                best = path.parent / "best.pt"
                best = best if best.is_file() else "<that run>/checkpoints/best.pt"
                raise ConfigError(
                    f"trainer.test_only=true evaluates a whole-file checkpoint, but trainer.resume={resume} is "
                    f"strategy=fsdp's sharded last.pt (a directory); give trainer.resume={best}, the best epoch's "
                    "weights in one file"
                )
            from distributed import sharded_state  # late: slow to import (BENCHMARKS.md: Start-up)

            checkpoint = sharded_state.describe(path)
        else:
            checkpoint = load_checkpoint(path)
        check_resumable(checkpoint, model(), path)
        warmed = isinstance(checkpoint["scheduler"], dict) and "last_step" in checkpoint["scheduler"]  # a Warmup's
        if not test_only and warmed != bool(warmup_epochs):
            raise ConfigError(
                f"trainer.resume={resume} trained {'with' if warmed else 'without'} a warmup and cannot continue "
                f"{'without' if warmed else 'with'} one; resume with the scheduler.warmup_epochs it trained with"
            )
        if not test_only:
            _check_schedule(resume, trained_config(checkpoint), scheduler)
    elif test_only and weights is None:
        raise ConfigError(
            f"trainer.test_only=true evaluates trained weights, but trainer.resume={resume} names no checkpoint; "
            "give trainer.resume=<checkpoint> or model.weights=<file>"
        )
    if test_only:
        return  # writes no checkpoint: a run dir's last.pt is safe
    last = run_dir / "checkpoints" / "last.pt" if run_dir is not None else None
    if last is not None and last.exists() and (path is None or path.resolve() != last.resolve()):
        raise ConfigError(
            f"hydra.run.dir={run_dir} already holds checkpoints/last.pt; continue it with trainer.resume=auto "
            "or train in another hydra.run.dir"
        )
    if run_dir is not None:
        record_torchrun_job(run_dir)


NOT_SHARED = "the run dir is not shared between nodes"
_SHARE_FIX = "put hydra.run.dir on a filesystem that every node mounts (docs/clusters.md)"


def agree_on_resume(resume: str | None, run_dir: Path, ctx: DistContext) -> Path | None:
    """The checkpoint to resume from, as rank 0 decides it; every rank must see that very file (its
    step and size), or every rank stops with the same one-line error. A rank that started afresh
    while the others resumed would train other weights, or wait in a collective they never reach."""
    path = find_resume(resume, run_dir)
    if ctx.world_size == 1:
        return path
    views = all_gather_object((socket.gethostname(), str(path) if path else None, _identity(path)), ctx)
    _, decided, identity = views[0]
    for rank, (host, mine, seen) in enumerate(views):
        if (mine, seen) != (decided, identity):
            what = f"resumes from {decided} ({_describe(identity)})" if decided else "starts afresh"
            sees = f"sees {_describe(seen)} at {mine or run_dir / 'checkpoints' / 'last.pt'}"
            raise ConfigError(f"{NOT_SHARED}: rank 0 {what} but rank {rank} on {host} {sees}; {_SHARE_FIX}")
    return path


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


def _identity(path: Path | None) -> tuple[int, int] | None:
    """(step, bytes) of a checkpoint as this rank sees it; None where it sees none. strategy=fsdp's
    last.pt is a directory named after its step (training/sharded_checkpoint.py)."""
    if path is None or not _listed(path):
        return None
    if path.is_dir():
        version = path.resolve()
        step = re.search(r"\.step(\d+)\.", version.name)
        return (int(step[1]) if step else -1, sum(f.stat().st_size for f in version.iterdir() if f.is_file()))
    try:
        step = torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("step", -1)
    except Exception:  # not a checkpoint this rank can read: its size still tells
        step = -1
    return (int(step), path.stat().st_size)


def _describe(identity: tuple[int, int] | None) -> str:
    return f"step {identity[0]}, {identity[1]} bytes" if identity else "no checkpoint"


@dataclass
class TrainState:
    epoch: int = 0  # the epoch running (or next to run)
    step: int = 0  # optimizer steps taken so far
    best_val_acc: float = -1.0
    batch: int = 0  # batches of `epoch` already trained: a mid-epoch checkpoint resumes after them
    rng: list[torch.Tensor] | None = None  # this rank's RNG state to restore once those batches are skipped
    best_val_acc5: float = -1.0
    best_weights: str = "model"  # which of a checkpoint's weights scored best_val_acc: model or ema


class Checkpointer:
    """Saves and restores everything needed to continue a run as if it had never stopped.

    A save copies the state to host memory on the spot and writes it from a background thread
    (as torchtitan's async checkpointing does), so the steps go on while the file is serialised
    and fsynced; writes stay one at a time and in order, each atomic. `close()` waits for the last.
    """

    def __init__(
        self,
        ctx: DistContext,
        directory: Path,
        model: nn.Module,
        optimizer,
        scheduler,
        config_yaml: str,
        scaler: torch.amp.GradScaler | None = None,
        ema: nn.Module | None = None,
    ):
        self.ctx, self.directory = ctx, directory
        self.model, self.optimizer, self.scheduler = unwrap(model), optimizer, scheduler
        self.scaler = scaler  # fp16's loss scale: resuming without it would re-learn it with skipped steps
        self.ema = ema  # trainer.ema_decay's averaged weights
        self.config_yaml = config_yaml
        self._best_on_disk = _best_in(directory / "best.pt") if ctx.is_main else None
        self._writer: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []  # oldest first

    def save(self, state: TrainState, best: bool = False) -> None:
        """last.pt, after best.pt when `best` and better than any best.pt on disk: one snapshot for both.

        Every rank must call this for a mid-epoch save (it gathers their RNG states)."""
        rng = _gather_rng(self.ctx) if state.batch else None
        if not self.ctx.is_main:
            return
        names = ["best.pt"] if best and self._better_than_on_disk(state) else []
        snapshot = _host_copy(
            {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                **self._train_state(state, rng),
            }
        )
        # One writer thread writes the files in order, each atomically; with the write in flight
        # and this one queued, a third save waits: at most two snapshots are held at once.
        self._wait(keep=1)
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        for name in [*names, "last.pt"]:
            self._pending.append(self._writer.submit(save_checkpoint, snapshot, self.directory / name))

    def _better_than_on_disk(self, state: TrainState) -> bool:
        """best.pt only ever gets better, even one left by an earlier run in this directory."""
        if self._best_on_disk is not None and state.best_val_acc <= self._best_on_disk:
            return False
        self._best_on_disk = state.best_val_acc
        return True

    def wait(self) -> None:
        """Until every save is on disk; a failed write raises here."""
        self._wait(keep=0)

    def _wait(self, keep: int) -> None:
        """Until at most `keep` writes are left queued or in flight; the first that failed raises."""
        while len(self._pending) > keep:
            self._pending.pop(0).result()

    def close(self) -> None:
        self.wait()
        if self._writer is not None:
            self._writer.shutdown()

    def _train_state(self, state: TrainState, rng: list | None) -> dict[str, Any]:
        """Everything but the weights and the optimizer state: the same in both checkpoint forms."""
        return {
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,  # {} when disabled
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "epoch": state.epoch,
            "step": state.step,
            "best": state.best_val_acc,
            "best_acc5": state.best_val_acc5,
            "best_weights": state.best_weights,
            "batch": state.batch,
            "rng": rng,
            "config": self.config_yaml,
        }

    def restore(self, path: Path) -> TrainState:
        """Every rank loads the same file; DDP's weights then agree without a broadcast."""
        self.wait()
        if path.is_dir():  # strategy=fsdp's sharded last.pt, resharded to this world size and strategy
            from distributed import sharded_state  # torch.distributed.checkpoint: slow to import

            checkpoint = sharded_state.load(path, self.model, self.optimizer, self.ctx)
        else:
            checkpoint = load_checkpoint(path)
            check_resumable(checkpoint, self.model, path)
            self._load_weights(checkpoint)
        if self.scheduler is not None and checkpoint["scheduler"] is not None:
            self.scheduler.load_state_dict(checkpoint["scheduler"])
        if self.scaler is not None and checkpoint.get("scaler"):
            self.scaler.load_state_dict(checkpoint["scaler"])
        if self.ema is not None and checkpoint.get("ema") is not None:
            self.ema.load_state_dict(checkpoint["ema"])
        elif self.ema is not None:
            log.warning("%s holds no EMA weights: the average starts afresh from the restored model", path)
        state = TrainState(
            checkpoint["epoch"],
            checkpoint["step"],
            checkpoint["best"],
            checkpoint.get("batch", 0),
            best_val_acc5=checkpoint.get("best_acc5", -1.0),
            best_weights=checkpoint.get("best_weights", "model"),
        )
        rng = checkpoint.get("rng")
        if rng is not None and len(rng) == self.ctx.world_size:
            state.rng = rng[self.ctx.rank]
        elif state.batch:
            log.warning("the checkpoint's world size differs: dropout randomness for the rest of this epoch will too")
        return state

    def _load_weights(self, checkpoint: dict[str, Any]) -> None:
        self.model.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])


def restore_rng(rng: list[torch.Tensor], ctx: DistContext) -> None:
    torch.set_rng_state(rng[0].cpu())
    if ctx.device.type == "cuda":  # a GPU run's checkpoint resumed on the CPU has nowhere to put them
        for device, state in zip(ctx.devices, rng[1:]):
            torch.cuda.set_rng_state(state.cpu(), device)


def _gather_rng(ctx: DistContext) -> list[list[torch.Tensor]]:
    """Each rank's RNG states (CPU, then each GPU it drives: dp's replicas draw dropout on
    every one of them), indexed by rank."""
    states = [torch.get_rng_state()]
    if ctx.device.type == "cuda":
        states += [torch.cuda.get_rng_state(device) for device in ctx.devices]
    return all_gather_object(states, ctx)


def _host_copy(value: Any) -> Any:
    """`value` with every tensor copied to host memory: training may change the originals (the
    optimizer's buffers, the weights) while the copy is being written."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: _host_copy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_host_copy(item) for item in value)
    return value


def _best_in(path: Path) -> float | None:
    try:
        return float(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["best"])
    except Exception:  # no best.pt yet, or one we cannot read: nothing to protect
        return None

"""Typed schemas for the config groups whose keys the code relies on.

train.py registers them in Hydra's ConfigStore: a typo'd key or a wrong type fails at start
with Hydra's own message. Plain dataclasses, so nothing here imports Hydra.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional


@dataclass
class TrainerConfig:
    accelerator: str = "auto"  # auto | gpu | cpu
    devices: int = 1
    gpus: Optional[int] = None  # shorthand: accelerator=gpu devices=N
    epochs: int = 10
    max_steps: Optional[int] = None  # stop early after this many optimizer steps
    batch_size: int = 64  # global: each of N ranks takes batch_size / N
    seed: int = 0
    limit_train_batches: Optional[int] = None  # dry runs: batches per epoch
    limit_val_batches: Optional[int] = None
    log_every_n_steps: int = 50
    progress_bar: bool = True
    resume: Optional[str] = None  # a checkpoint path, or auto: this run dir's last.pt if any
    checkpoint_every_n_steps: Optional[int] = None  # also save last.pt mid-epoch
    # Preemption: these signals make every rank finish its step and save last.pt, then exit;
    # under SLURM the requeue signals also requeue the job (SIGTERM is also scancel's: no requeue).
    preempt_signals: List[str] = field(default_factory=lambda: ["SIGTERM", "SIGUSR1"])
    requeue_signals: List[str] = field(default_factory=lambda: ["SIGUSR1"])
    preempt_check_every_n_steps: Optional[int] = None  # None: at each log_every_n_steps (no extra sync)


@dataclass
class StrategyConfig:
    name: str = "single"
    # DistributedDataParallel options (ignored by single)
    gradient_as_bucket_view: bool = True
    find_unused_parameters: bool = False
    static_graph: bool = False
    bucket_cap_mb: Optional[float] = None  # None: DDP's default (25)
    sync_batchnorm: bool = False


@dataclass
class LauncherConfig:
    name: str = "spawn"
    master_addr: str = "127.0.0.1"
    master_port: Optional[int] = None  # None: a free port, picked per run
    timeout_s: float = 60.0  # a rank that waits this long on a dead or hung peer fails the job


@dataclass
class DataConfig:
    num_workers: int = 0
    pin_memory: Optional[bool] = None  # None: on when training on CUDA


@dataclass
class Config:
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: Any = None
    dataset: Any = None
    optimizer: Any = None
    scheduler: Any = None

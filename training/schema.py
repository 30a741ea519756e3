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
    num_nodes: int = 1  # devices/gpus count processes per node
    epochs: int = 10
    max_steps: Optional[int] = None  # stop early after this many optimizer steps
    batch_size: int = 64  # global: each of N ranks takes batch_size / N
    seed: int = 0
    limit_train_batches: Optional[int] = None  # dry runs: batches per epoch
    limit_val_batches: Optional[int] = None
    log_every_n_steps: int = 50
    progress_bar: bool = True
    precision: str = "32"  # 32 | bf16-mixed | 16-mixed (CUDA only: fp16 autocast + GradScaler)
    accumulate_grad_batches: int = 1  # micro-batches (each of batch_size) per optimizer step
    grad_clip: Optional[float] = None  # max global gradient norm; None: no clipping
    channels_last: bool = False  # NHWC memory format for model and images
    compile: bool = False  # torch.compile the model before DP/DDP wrap it
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
    # DistributedDataParallel options (ignored by single and dp)
    gradient_as_bucket_view: bool = True
    find_unused_parameters: bool = False
    static_graph: bool = False
    bucket_cap_mb: Optional[float] = None  # None: DDP's default (25)
    sync_batchnorm: bool = False


@dataclass
class LauncherConfig:
    name: str = "auto"  # auto | spawn | torchrun | slurm
    master_addr: Optional[str] = None  # None: 127.0.0.1 / torchrun's / the SLURM job's first node
    master_port: Optional[int] = None  # None: a free port / torchrun's / from the SLURM job id
    timeout_s: float = 60.0  # collectives that wait longer fail the job


@dataclass
class DataConfig:
    loader: str = "dataloader"  # dataloader (workers, per-sample transforms) | device (whole set on the device)
    num_workers: Optional[int] = None  # None: this task's CPUs / local ranks (0 for in-memory tensors)
    pin_memory: Optional[bool] = None  # None: on when training on CUDA
    persistent_workers: bool = True  # keep workers alive between epochs


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

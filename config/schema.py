"""Every config key the code reads, with its one default, as plain dataclasses.

Registered in Hydra's ConfigStore (config.setup), so a typo'd key or a wrong type fails at
composition; converted once with OmegaConf.to_object (config.typed), so everything below train.py
receives these types and never a DictConfig. Each dataclass checks its own values in
`__post_init__`, which that conversion runs: a value no machine could train with is a one-line
ConfigError naming its key before anything else is looked at. What depends on this machine or the
data (the world, the devices, the files) is the pre-flight's (preflight.py). Closed choices are
Enums matched by name (OmegaConf 2.3 rejects Literal and matches Enums by member name);
trainer.precision stays a string, because its names ("32", "bf16-mixed") are not identifiers.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from errors import ConfigError

MISSING = "???"  # OmegaConf's mark for a value the YAML must give (its own MISSING, without importing it)


class Accelerator(Enum):
    auto = "auto"  # a GPU if one is visible, else the CPU
    gpu = "gpu"
    cpu = "cpu"


class StrategyName(Enum):
    single = "single"
    dp = "dp"
    ddp = "ddp"
    fsdp = "fsdp"  # FSDP2 (fully_shard): parameters, gradients and optimizer state sharded over the ranks


class LauncherName(Enum):
    auto = "auto"  # torchrun's or SLURM's ranks if they started us, else spawn
    spawn = "spawn"
    torchrun = "torchrun"
    slurm = "slurm"


class StartMethod(Enum):  # how train.py starts the ranks it launches itself (torch.multiprocessing)
    spawn = "spawn"  # a fresh interpreter per rank, as torch.multiprocessing.spawn (the seeds)
    forkserver = "forkserver"  # one server imports torch and train.py once, then forks each rank from it
    fork = "fork"  # CPU only: each rank a copy of this process, nothing imported again (CUDA cannot be forked)


class Backend(Enum):  # torch.distributed's (the ImageNet example's --dist-backend)
    nccl = "nccl"  # GPUs only
    gloo = "gloo"  # CPU, or GPUs where NCCL will not run (its all-reduce copies through host memory)


class Loader(Enum):
    dataloader = "dataloader"  # workers, per-sample transforms
    device = "device"  # the split held on the device, augmented a batch at a time


class Decode(Enum):  # where an image file's JPEG bytes become pixels
    auto = "auto"  # gpu when training on CUDA from image files, unless a CPU-only augmentation is on; else cpu
    cpu = "cpu"  # PIL in DataLoader workers, which hand over uint8 crops
    gpu = "gpu"  # workers read bytes; the training process decodes each batch on its device (nvJPEG)


class MonitorMode(Enum):  # which way a monitored figure is better
    auto = "auto"  # the way its name says: a loss min; an accuracy, an F1 max (training/monitor.py)
    max = "max"
    min = "min"


class NonFinite(Enum):
    stop = "stop"  # end the run at the step, naming it; nothing past it is saved
    skip = "skip"  # drop the step's update, count it, go on


class AutoAugment(Enum):  # torchvision's policies, as its reference scripts name them
    ta_wide = "ta_wide"  # TrivialAugmentWide
    ra = "ra"  # RandAugment (magnitude 9)
    augmix = "augmix"  # AugMix (severity 3)


class LrScaling(Enum):
    none = "none"  # optimizer.lr as written
    linear = "linear"  # lr x (global batch x accumulate_grad_batches) / reference_batch


PRECISIONS = ("32", "bf16-mixed", "16-mixed")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile's


def devices_per_node(gpus: Optional[int], devices: int) -> int:
    """trainer.gpus=N is shorthand for accelerator=gpu devices=N."""
    return int(gpus if gpus is not None else devices)


def parse_signals(names: List[str], key: str) -> List[signal.Signals]:
    """`[SIGTERM, USR1]` -> signals; a ConfigError naming `key` for anything else."""
    parsed = []
    for name in names or []:
        full = str(name).upper() if str(name).upper().startswith("SIG") else f"SIG{str(name).upper()}"
        if full not in signal.Signals.__members__ or full in ("SIGKILL", "SIGSTOP"):
            raise ConfigError(f"{key}: {name} is not a signal a process can catch; use e.g. [SIGTERM, SIGUSR1]")
        parsed.append(signal.Signals[full])
    return parsed


def taken_signals(signals: Iterable[signal.Signals]) -> List[signal.Signals]:
    """Those of the preemption signals this process takes: not one it started with ignored, as nohup
    starts a run meant to outlive its terminal (SIGHUP), but SIGINT always, which a script's `... &`
    ignores for its job by the way (and which a spawned rank gets when its launcher dies)."""
    return [sig for sig in signals if sig == signal.SIGINT or signal.getsignal(sig) is not signal.SIG_IGN]


def check_ranges(section: str, ranges: List[Tuple[str, Any, bool, str]]) -> None:
    """(key, value, whether it is allowed, what is): the first value not allowed, as one line."""
    for key, value, allowed, what in ranges:
        if not allowed:
            raise ConfigError(f"{section}.{key}={value}: use {what}")


def _at_least_1_or_null(value: Optional[int]) -> bool:
    return value is None or value >= 1


@dataclass
class CheckpointConfig:
    """Which checkpoints are kept besides last.pt: the `save_top_k` best by `monitor`, a figure of
    validation's end (val/acc, val/loss, val_ema/acc, what a callback adds: val/macro_f1, ...).
    best.pt is the best of them."""

    monitor: str = "val/acc"
    mode: MonitorMode = MonitorMode.auto
    save_top_k: int = 1

    def __post_init__(self) -> None:
        check_ranges(
            "trainer.checkpoint",
            [("save_top_k", self.save_top_k, self.save_top_k >= 1, "1 (best.pt alone) or more")],
        )


@dataclass
class TrainerConfig:
    accelerator: Accelerator = Accelerator.auto
    devices: int = 1  # per node: one process each (dp: one process drives them all)
    gpus: Optional[int] = None  # shorthand: trainer.gpus=4 means accelerator=gpu devices=4
    # torchrun/SLURM must start devices x num_nodes processes; null: as many nodes as the launcher
    # starts (torchrun --nnodes=MIN:MAX, whose re-forms change the world)
    num_nodes: Optional[int] = 1
    epochs: int = 15
    max_steps: Optional[int] = None  # stop early after this many optimizer steps
    batch_size: int = 64  # global: each of N ranks takes batch_size / N
    # A rank's samples per forward at most (per GPU under dp): a larger share of batch_size is trained
    # in more, smaller micro-batches, accumulated, so the global batch stays (training/batch_layout.py)
    max_batch_per_device: Optional[int] = None
    seed: int = 0
    limit_train_batches: Optional[int] = None  # dry runs: batches per epoch
    limit_val_batches: Optional[int] = None
    overfit_batches: Optional[int] = None  # train (unshuffled) and validate on these first batches only
    val_batch_size: Optional[int] = None  # the global validation batch (seed 002's --test-batch-size); null: batch_size
    log_every_n_steps: int = 50  # the loss, acc (train/*_window) and lr since the last point: loggers, log where no bar
    progress_bar: bool = True  # rank 0's, where stderr is a terminal (a SLURM log or a pipe gets lines instead)
    # 32 | bf16-mixed | 16-mixed (fp16 autocast with a GradScaler; CUDA only). At 32, Ampere and later
    # GPUs run cuDNN's convolutions in TF32 (torch.backends.cudnn.allow_tf32, on by default).
    precision: str = "32"
    accumulate_grad_batches: int = 1  # micro-batches of batch_size per optimizer step; max_steps counts steps
    grad_clip: Optional[float] = None  # max gradient norm (all parameters together); None: no clipping
    channels_last: bool = False  # NHWC memory format for model and images (faster convs on tensor cores)
    compile: bool = False  # torch.compile the model before DDP wraps it
    # torch.compile's mode: default | reduce-overhead (each step's kernels replayed as CUDA graphs: for
    # GPU steps too short to hide the CPU's kernel launches, e.g. 32x32 images) | max-autotune |
    # max-autotune-no-cudagraphs. CPU runs compile without the graphs.
    compile_mode: str = "default"
    cudnn_benchmark: bool = True  # let cuDNN time its conv algorithms once per input shape (CUDA only)
    # Bitwise-repeatable GPU runs (the ImageNet example's --seed): deterministic kernels only (an op
    # without one raises), cuDNN benchmark off; slower. CPU runs here are deterministic already.
    deterministic: bool = False
    nonfinite: NonFinite = NonFinite.stop  # a NaN/inf loss: stop the run, or skip the step
    # a last.pt/best.pt path, a run dir or its checkpoints/ folder (its last.pt), or auto: this run dir's
    # last.pt if there is one (null: auto in a requeued SLURM or restarted torchrun job)
    resume: Optional[str] = None
    # Fine-tuning: start from a trained run's weights (a run dir, or its best.pt, last.pt or strategy=fsdp's
    # sharded last.pt; the best of its model's and EMA's, as predict.py takes), with a fresh optimizer,
    # schedule and epoch count; a tensor shaped otherwise (a head for other classes) stays fresh. A resume wins.
    init_from: Optional[str] = None
    checkpoint_every_n_steps: Optional[int] = None  # also save last.pt every N steps (mid-epoch)
    # also save last.pt once N seconds have passed since the last save, by rank 0's clock, at the
    # preemption watch's checks (training/checkpoint/cadence.py)
    checkpoint_every_n_seconds: Optional[float] = None
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)  # the best ones, by a figure
    # Preemption: these signals make every rank finish its step and save last.pt, then exit;
    # under SLURM the requeue signals also requeue the job (SIGTERM is also scancel's: no requeue).
    # USR1: slurm/train.sbatch's --signal; USR2: hydra/launcher=submitit_slurm's (submitit's own);
    # INT: Ctrl-C, whose run then resumes where it stopped (a second Ctrl-C stops at once); HUP: the
    # terminal closed, or its ssh session dropped (a run under nohup ignores it still: taken_signals).
    preempt_signals: List[str] = field(default_factory=lambda: ["SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2"])
    requeue_signals: List[str] = field(default_factory=lambda: ["SIGUSR1", "SIGUSR2"])
    # Seconds from the signal to SIGKILL: SLURM's KillWait after SIGTERM, torchrun's --shutdown-timeout,
    # the lead of `--signal=USR1@90`. The ranks check for a signal a quarter of it apart.
    preempt_grace_s: float = 30.0
    # Recipes (torchvision's reference scripts):
    label_smoothing: float = 0.0  # cross-entropy against (1 - s) x the label + s spread over all classes
    mixup_alpha: float = 0.0  # > 0: MixUp with Beta(alpha, alpha) on every training batch
    cutmix_alpha: float = 0.0  # > 0: CutMix; with mixup_alpha too, each batch gets one of the two
    ema_decay: Optional[float] = None  # EMA of weights and buffers, evaluated beside the model; None: off
    ema_every_n_steps: int = 1  # update the EMA every N optimizer steps (the decay is adjusted for N)
    # evaluate trained weights (trainer.resume's, trainer.init_from's or model.weights') on the validation set; no training
    test_only: bool = False
    # torch.profiler over N optimizer steps after a warm-up (training.profiling): <run dir>/profile/trace.json
    # for Perfetto or chrome://tracing, the top operators in the log; on CUDA, kernels and memory too.
    profile: Optional[int] = None

    @property
    def devices_per_node(self) -> int:
        return devices_per_node(self.gpus, self.devices)

    @property
    def ema_decay_per_update(self) -> Optional[float]:
        """ema_decay adjusted as torchvision does (from pycls), so that the average spans the same
        share of training whatever the batch, the update interval and the epochs:
        1 - decay' = (1 - decay) * global batch * accumulation * every_n_steps / epochs, at most 1."""
        if self.ema_decay is None:
            return None
        return 1.0 - min(1.0, (1.0 - self.ema_decay) * self._ema_updates_share)

    @property
    def _ema_updates_share(self) -> float:
        return self.batch_size * self.accumulate_grad_batches * self.ema_every_n_steps / self.epochs

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ConfigError(f"trainer.precision={self.precision}: choose 32, bf16-mixed or 16-mixed")
        if self.compile_mode not in COMPILE_MODES:
            raise ConfigError(f"trainer.compile_mode={self.compile_mode}: choose {', '.join(COMPILE_MODES)}")
        if self.compile_mode != "default" and not self.compile:
            raise ConfigError(
                f"trainer.compile_mode={self.compile_mode} compiles nothing alone; add trainer.compile=true"
            )
        positive = "a positive number, or null"
        check_ranges(
            "trainer",
            [
                ("epochs", self.epochs, self.epochs >= 1, "at least 1 epoch"),
                (
                    "max_steps",
                    self.max_steps,
                    _at_least_1_or_null(self.max_steps),
                    "1 or more optimizer steps, or null for no limit but trainer.epochs",
                ),
                ("log_every_n_steps", self.log_every_n_steps, self.log_every_n_steps >= 1, "1 or more"),
                ("seed", self.seed, self.seed >= 0, "0 or more (NumPy's generators take no negative seed)"),
                (
                    "accumulate_grad_batches",
                    self.accumulate_grad_batches,
                    self.accumulate_grad_batches >= 1,
                    "1 (no accumulation) or more",
                ),
                (
                    "grad_clip",
                    self.grad_clip,
                    self.grad_clip is None or self.grad_clip > 0,
                    "a positive max norm, or null for none",
                ),
                (
                    "limit_train_batches",
                    self.limit_train_batches,
                    _at_least_1_or_null(self.limit_train_batches),
                    positive,
                ),
                ("limit_val_batches", self.limit_val_batches, _at_least_1_or_null(self.limit_val_batches), positive),
                (
                    "checkpoint_every_n_steps",
                    self.checkpoint_every_n_steps,
                    _at_least_1_or_null(self.checkpoint_every_n_steps),
                    positive,
                ),
                (
                    "checkpoint_every_n_seconds",
                    self.checkpoint_every_n_seconds,
                    self.checkpoint_every_n_seconds is None or self.checkpoint_every_n_seconds > 0,
                    "a positive number of seconds, or null",
                ),
                ("overfit_batches", self.overfit_batches, _at_least_1_or_null(self.overfit_batches), positive),
                (
                    "max_batch_per_device",
                    self.max_batch_per_device,
                    _at_least_1_or_null(self.max_batch_per_device),
                    positive,
                ),
                (
                    "num_nodes",
                    self.num_nodes,
                    _at_least_1_or_null(self.num_nodes),
                    "1 or more, or null for as many as the launcher starts",
                ),
                ("label_smoothing", self.label_smoothing, 0 <= self.label_smoothing < 1, "0 (off) up to below 1"),
                ("mixup_alpha", self.mixup_alpha, self.mixup_alpha >= 0, "0 (off) or a Beta(alpha, alpha)"),
                ("cutmix_alpha", self.cutmix_alpha, self.cutmix_alpha >= 0, "0 (off) or a Beta(alpha, alpha)"),
                (
                    "ema_decay",
                    self.ema_decay,
                    self.ema_decay is None or 0 < self.ema_decay < 1,
                    "a decay in (0, 1), e.g. 0.99998, or null",
                ),
                ("ema_every_n_steps", self.ema_every_n_steps, self.ema_every_n_steps >= 1, "1 or more"),
                (
                    "preempt_grace_s",
                    self.preempt_grace_s,
                    self.preempt_grace_s > 0,
                    "the positive seconds from the signal to SIGKILL (SLURM's KillWait)",
                ),
            ],
        )
        if self.ema_decay_per_update == 0:
            # A decay of 0 copies the model at every update: an average of nothing, evaluated twice.
            raise ConfigError(
                f"trainer.ema_decay={self.ema_decay}: adjusted for global batch {self.batch_size} x "
                f"{self.accumulate_grad_batches} micro-batches x every {self.ema_every_n_steps} step(s) over "
                f"{self.epochs} epoch(s) as torchvision does, it is 0 per update, a copy of the model; give a decay "
                f"above {1 - 1 / self._ema_updates_share:.6g} (torchvision's recipes: 0.99998), or null"
            )
        if not _at_least_1_or_null(self.profile):
            raise ConfigError(f"trainer.profile={self.profile}: profile 1 or more optimizer steps, or null for none")
        parse_signals(self.preempt_signals, "trainer.preempt_signals")
        parse_signals(self.requeue_signals, "trainer.requeue_signals")


@dataclass
class StrategyConfig:
    name: StrategyName = StrategyName.single
    # DistributedDataParallel's options (single and dp ignore them)
    gradient_as_bucket_view: bool = True  # gradients are views into the buckets: one copy less in memory
    find_unused_parameters: bool = False  # true only for models that skip parameters in some forwards
    static_graph: bool = False
    bucket_cap_mb: Optional[float] = None  # None: DDP's default, 25
    # Copy rank 0's buffers (BatchNorm statistics) to every rank before each forward. false skips
    # it and changes nothing saved or reported: rank 0 only ever receives its own, and evaluation
    # and checkpoints take rank 0's. Keep true for a model whose training forward reads buffers.
    forward_sync_buffers: bool = True
    sync_batchnorm: bool = False  # BatchNorm statistics over the global batch (on CPU ranks too; ddp and fsdp)
    # FSDP2's options (strategy=fsdp; the others ignore them)
    reshard_after_forward: bool = True  # free a block's gathered parameters after its forward (ZeRO-3); false: ZeRO-2
    mixed_precision: bool = True  # gather parameters in trainer.precision's dtype, reduce gradients in fp32
    cpu_offload: bool = False  # parameter, gradient and optimizer shards in host memory; the optimizer steps there
    shard_modules: Optional[List[str]] = None  # classes sharded a group each ([Bottleneck]); None: the repeated blocks

    def __post_init__(self) -> None:
        check_ranges(
            "strategy",
            [
                (
                    "bucket_cap_mb",
                    self.bucket_cap_mb,
                    self.bucket_cap_mb is None or self.bucket_cap_mb > 0,
                    "a positive size in MB, or null for DDP's 25",
                ),
            ],
        )


@dataclass
class LauncherConfig:
    name: LauncherName = LauncherName.auto
    master_addr: Optional[str] = None  # None: 127.0.0.1 (spawn), torchrun's, the job's first node (SLURM)
    master_port: Optional[int] = None  # None: a free port (spawn), torchrun's, from the SLURM job and step ids
    # Every collective's limit; NCCL aborts a rank that waits longer. A first torch.compile step,
    # 8 ranks scanning an ImageNet folder or a checkpoint fsync on a network disk take minutes.
    timeout_s: float = 600.0
    start_method: StartMethod = StartMethod.spawn
    backend: Optional[Backend] = None  # None: nccl on GPUs, gloo on CPU

    def __post_init__(self) -> None:
        check_ranges(
            "launcher",
            [
                ("timeout_s", self.timeout_s, self.timeout_s > 0, "a positive number of seconds"),
                (
                    "master_port",
                    self.master_port,
                    self.master_port is None or 1 <= self.master_port <= 65535,
                    "a TCP port, 1 to 65535, or null for a free one",
                ),
            ],
        )


@dataclass
class DataConfig:
    loader: Loader = Loader.dataloader
    num_workers: Optional[int] = None  # None: this task's CPUs / local ranks (0 for in-memory tensors)
    pin_memory: Optional[bool] = None  # None: on when training on CUDA
    persistent_workers: bool = True  # workers live across epochs
    repeated_augmentations: int = 1  # N > 1: each drawn image N times, differently augmented (RASampler)
    decode: Decode = Decode.auto  # image files: decode in workers (cpu) or a batch at a time on the device (gpu)

    def __post_init__(self) -> None:
        check_ranges(
            "data",
            [
                (
                    "repeated_augmentations",
                    self.repeated_augmentations,
                    self.repeated_augmentations >= 1,
                    "1 (off) or more",
                ),
                (
                    "num_workers",
                    self.num_workers,
                    self.num_workers is None or self.num_workers >= 0,
                    "0 (load in the training process), a number of worker processes, or null (this task's CPUs "
                    "shared among its ranks)",
                ),
            ],
        )


@dataclass
class AugmentConfig:  # training only
    crop_padding: int = 0  # RandomCrop(image_size, padding)
    flip: bool = False  # RandomHorizontalFlip


@dataclass
class DatasetConfig:
    name: str = MISSING  # conf/dataset/<name>.yaml's; data/__init__.py's DATASETS names what serves it
    channels: int = MISSING
    image_size: int = MISSING  # what the model is built for; ImageNet-style: train_crop's and val_crop's default
    num_classes: Optional[int] = None  # None: the dataset counts them, if it can (imagefolder: its class folders)
    root: Optional[str] = None  # where the files live (datasets with files to fetch: ${paths.data_dir})
    download: bool = True  # rank 0 fetches missing files; false on nodes without internet
    resize: Optional[int] = None  # set: ImageNet-style RandomResizedCrop / Resize + CenterCrop (val_resize's default)
    # ImageNet-style sizes (torchvision's recipe trains at 176 and validates 232 -> 224):
    train_crop: Optional[int] = None  # RandomResizedCrop; None: image_size
    val_resize: Optional[int] = None  # Resize before the centre crop; None: resize
    val_crop: Optional[int] = None  # CenterCrop; None: image_size
    auto_augment: Optional[AutoAugment] = None  # training: a per-image policy (DataLoader path only)
    random_erase: float = 0.0  # training: RandomErasing's probability (DataLoader path only)
    mean: Optional[List[float]] = None  # None: no normalisation
    std: Optional[List[float]] = None
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    val_fraction: float = 0.2  # digits: the stratified validation share
    train_size: int = 2048  # synthetic: samples per split
    val_size: int = 512
    seed: int = 0  # synthetic: the random images

    def __post_init__(self) -> None:
        if self.root is not None:
            # torchvision expands it in its download code, which would fetch into the home folder while
            # the files were looked for under a folder named `~` here (a quoted `~` reaches us as is).
            self.root = os.path.expanduser(self.root)
        check_ranges(
            "dataset",
            [
                ("random_erase", self.random_erase, 0 <= self.random_erase <= 1, "a probability, 0 (off) to 1"),
                ("train_size", self.train_size, self.train_size >= 1, "1 or more samples"),
                ("val_size", self.val_size, self.val_size >= 1, "1 or more samples"),
            ],
        )


@dataclass
class PathsConfig:  # values in conf/paths/default.yaml: they depend on the machine
    root_dir: str = MISSING
    data_dir: str = MISSING
    log_dir: str = MISSING
    sweep_dir: str = MISSING


class WandbMode(Enum):  # wandb.init's
    offline = "offline"  # <run dir>/wandb/offline-run-*: nothing leaves the machine until `wandb sync <that dir>`
    online = "online"  # streamed to the W&B server (wandb login, or WANDB_API_KEY)
    disabled = "disabled"


@dataclass
class WandbConfig:  # logger=wandb: a W&B run per job, named by its overrides, grouped by its sweep
    mode: Optional[WandbMode] = None  # None: $WANDB_MODE where set, else offline
    project: Optional[str] = None  # None: $WANDB_PROJECT, else W&B's own default
    entity: Optional[str] = None  # None: your W&B default (a team's name to log to the team)
    tags: List[str] = field(default_factory=list)


@dataclass
class MlflowConfig:  # logger=mlflow: an MLflow run per job, named by its overrides, a sweep's jobs one experiment
    # Any MLflow tracking URI (http://host:5000, databricks, sqlite:///path.db). None: $MLFLOW_TRACKING_URI
    # where set, else SQLite in mlflow.db in the sweep's dir (a single run: its run dir).
    tracking_uri: Optional[str] = None
    experiment: Optional[str] = None  # None: the sweep's dir (e.g. search/digits), or "runs" for a single run


@dataclass
class LoggerConfig:
    """Each backend is on when its key is set: conf/logger/ sets one per option, so that
    `logger=[tensorboard,csv]` (Hydra's list of a group's options) turns on both."""

    tensorboard: bool = False  # scalars, hparams and sample images under <run dir>/tb (logger=tensorboard, the default)
    csv: bool = False  # <run dir>/metrics.csv, a row per logged step; hparams.csv, the options and final figures
    wandb: Optional[WandbConfig] = None
    mlflow: Optional[MlflowConfig] = None
    sample_images: int = 8  # validation images drawn with their predictions each epoch (two rows)

    def __post_init__(self) -> None:
        check_ranges(
            "logger", [("sample_images", self.sample_images, self.sample_images >= 0, "0 (no grid) or more images")]
        )


@dataclass
class OptimizerOptions:
    """optimizer.* keys for the trainer, beside the `_target_`'s own arguments (lr, momentum, ...);
    the pre-flight (preflight.py) takes them out before the optimizer is built."""

    lr_scaling: LrScaling = LrScaling.none
    reference_batch: int = 256  # lr_scaling=linear: the batch optimizer.lr was tuned for
    norm_weight_decay: Optional[float] = None  # normalisation layers and biases; None: weight_decay as the rest

    def __post_init__(self) -> None:
        decay = self.norm_weight_decay
        check_ranges(
            "optimizer",
            [
                ("reference_batch", self.reference_batch, self.reference_batch >= 1, "the batch lr was tuned for"),
                ("norm_weight_decay", decay, decay is None or decay >= 0, "null (as weight_decay) or 0 and up"),
            ],
        )


@dataclass
class SchedulerOptions:
    """scheduler.* keys for the trainer, beside the `_target_`'s own arguments (T_max, step_size, ...)."""

    warmup_epochs: int = 0  # linear warmup in front of the scheduler, stepped every optimizer step
    warmup_start_factor: float = 0.01  # the first step's lr, as a fraction of the lr warmup leads to

    def __post_init__(self) -> None:
        factor = self.warmup_start_factor
        check_ranges(
            "scheduler",
            [
                ("warmup_epochs", self.warmup_epochs, self.warmup_epochs >= 0, "0 (off) or more"),
                ("warmup_start_factor", factor, 0 < factor <= 1, "a fraction of the lr in (0, 1]"),
            ],
        )


def defaults_of(cls: type) -> Callable[[], Dict[str, Any]]:
    """An untyped `_target_` node that starts with `cls`'s keys, so `optimizer.lr_scaling=linear`
    overrides like any key; the pre-flight types them (an Any node cannot hold a typed part)."""
    return lambda: {f.name: f.default for f in fields(cls)}


@dataclass
class Config:
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    data: DataConfig = field(default_factory=DataConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    # `_target_` nodes: the pre-flight turns them into factories (Hydra partials) for the workers.
    model: Any = None
    optimizer: Any = field(default_factory=defaults_of(OptimizerOptions))
    scheduler: Any = field(default_factory=defaults_of(SchedulerOptions))
    loss: Any = None
    callbacks: Dict[str, Any] = field(default_factory=dict)  # name -> `_target_` node (conf/callbacks/)
    optimized_metric: str = "best_val_acc"  # the metrics.json figure main() returns to a sweeper


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a run continues, as the pre-flight found it: every rank must see this very file
    (its step and size), or the run stops in one line (training.checkpoint.resume)."""

    path: Path  # a last.pt or best.pt file, or strategy=fsdp's sharded last.pt (a directory)
    step: int  # the optimizer steps it holds
    size: int  # its bytes (a sharded one's: its files' together)


@dataclass(frozen=True)
class RunConfig:
    """What every worker receives: typed settings, factories for what must be built per process,
    and the run's identity. Picklable, for torch.multiprocessing.spawn."""

    trainer: TrainerConfig
    strategy: StrategyConfig
    launcher: LauncherConfig
    data: DataConfig
    dataset: DatasetConfig
    logger: LoggerConfig
    model: Callable[[], Any]  # () -> nn.Module
    optimizer: Callable[..., Any]  # (parameters) -> Optimizer, lr scaled already
    scheduler: Optional[Callable[..., Any]]  # (optimizer) -> LRScheduler, None: a constant lr
    loss: Callable[[], Any]  # () -> the criterion (training.loss.Criterion)
    callbacks: Dict[str, Callable[[], Any]]  # name -> () -> a training.callbacks.Callback, in conf/callbacks/ order
    optimizer_options: OptimizerOptions  # optimizer.* beside the optimizer's own arguments
    scheduler_options: SchedulerOptions  # scheduler.* beside the scheduler's own arguments
    run_dir: Path
    choices: Dict[str, str]  # the chosen model, dataset and strategy options, for the log and metrics.json
    hparams: Dict[str, Any]  # every option the run used, {dotted key: value} (config.hparams.hparams): its record
    swept: Dict[str, Any]  # its command-line overrides, {key: value}
    config_yaml: str  # the composed config, saved in every checkpoint
    preempt_signals: Tuple[signal.Signals, ...]  # trainer.preempt_signals, parsed once before launch
    requeue_signals: Tuple[signal.Signals, ...] = ()  # trainer.requeue_signals, parsed with them
    sweep_dir: Optional[Path] = None  # the dir of the -m sweep or search this job is one of; None: a single run
    # The keys whose value differs between the sweep's jobs, each with the values they take
    # (config.hparams.varied_hparams): the HParams tab's differing ones. {}: a single run.
    varied: Dict[str, Tuple[Any, ...]] = field(default_factory=dict)
    resume: Optional[ResumePoint] = None  # the checkpoint to continue, decided once before launch; None: afresh

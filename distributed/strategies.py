"""One object per strategy: how many processes and devices it uses, what it refuses, how it wraps
a plain nn.Module and unwraps it again, how a micro-batch skips the gradient all-reduce, and
whether its checkpoints are sharded.

Chosen once, by `get`; past it only launch._check_gpus's CPU-rehearsal hint (dp rehearses as ddp)
reads a strategy's name.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from config.schema import Accelerator, StrategyConfig, StrategyName, TrainerConfig
from distributed import fsdp
from distributed.collectives import all_reduce_max, broadcast_from_main
from distributed.context import DistContext
from distributed.sync_batchnorm import convert_sync_batchnorm
from errors import ConfigError

log = logging.getLogger("train")

# torch 2.14 renamed DistributedDataParallel's broadcast_buffers; older releases know only that name.
SYNC_BUFFERS_ARG = (
    "forward_sync_buffers"
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
    else "broadcast_buffers"
)


@dataclass(frozen=True)
class Strategy:
    config: StrategyConfig
    name: ClassVar[str]
    process_group: ClassVar[bool] = False  # needs torch.distributed, even at world size 1
    sharded_checkpoint: ClassVar[bool] = False  # last.pt: each rank's shards in a directory, not one file

    @property
    def host_collectives(self) -> bool:
        """Collectives on host tensors in a GPU job (they need a gloo group beside NCCL)."""
        return False

    def processes_per_node(self, devices: int) -> int:
        return devices

    def devices_per_process(self, devices: int) -> int:
        return 1

    def check(self, settings: TrainerConfig, accelerator: Accelerator, devices: int, num_nodes: int) -> None:
        """Raise a one-line ConfigError for a combination this strategy cannot train."""

    def check_model(self, build: Callable[[], nn.Module]) -> None:
        """Raise a one-line ConfigError if this strategy's options do not fit the model `build` makes."""

    def wrap(
        self, model: nn.Module, ctx: DistContext, compile_mode: str | None, precision_dtype: torch.dtype | None
    ) -> nn.Module:
        """`model` is on ctx.device; `compile_mode`: torch.compile's, None to leave it eager. Compiling
        comes after module swaps and before DDP wraps, as nanoGPT and timm do: DDP runs the compiled
        module inside its forward, where dynamo's DDPOptimizer splits the graph at DDP's bucket
        boundaries so that each bucket's all-reduce overlaps the rest of the backward (GPU-relevant;
        torch/_dynamo/convert_frame.py, DistributedDataParallel._get_active_ddp_module)."""
        return compiled(model, compile_mode)

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """A micro-batch that is not the last of its accumulation group: no gradient all-reduce."""
        return contextlib.nullcontext()


class Single(Strategy):
    name = "single"

    def processes_per_node(self, devices: int) -> int:
        return 1

    def check(self, settings: TrainerConfig, accelerator: Accelerator, devices: int, num_nodes: int) -> None:
        if devices * num_nodes > 1:
            raise ConfigError(
                f"strategy=single trains on one device but trainer.devices={devices} trainer.num_nodes={num_nodes}; "
                "use strategy=ddp for several devices"
            )


class DataParallel(Strategy):
    """nn.DataParallel: one process drives every GPU of the node, splitting each batch over them."""

    name = "dp"

    def processes_per_node(self, devices: int) -> int:
        return 1

    def devices_per_process(self, devices: int) -> int:
        return devices

    def check(self, settings: TrainerConfig, accelerator: Accelerator, devices: int, num_nodes: int) -> None:
        if accelerator == Accelerator.cpu and devices > 1:
            raise ConfigError(
                f"strategy=dp with trainer.devices={devices} splits each batch over {devices} GPUs but runs on CPU; "
                f"use trainer.devices=1, or strategy=ddp to rehearse {devices} devices on CPU"
            )
        if num_nodes > 1:
            raise ConfigError(
                f"strategy=dp runs in one process on one node but trainer.num_nodes={num_nodes}; use strategy=ddp"
            )
        if self.config.sync_batchnorm:
            # Each replica normalises its slice of the batch; DataParallel keeps replica 0's
            # running statistics (GPU-only: its replicas are made by torch/nn/parallel/replicate.py).
            raise ConfigError(
                "strategy.sync_batchnorm=true under strategy=dp: DataParallel cannot sync BatchNorm across its "
                "replicas; use strategy=ddp with strategy.sync_batchnorm=true"
            )
        if settings.compile and devices > 1:
            # DataParallel replicates its module on every forward; replicating torch.compile's
            # OptimizedModule writes through to the original network (GPU-only: replicate needs CUDA).
            raise ConfigError(
                f"strategy=dp with trainer.compile=true on {devices} GPUs: DataParallel re-replicates the model "
                "every step, which breaks a compiled model; use strategy=ddp (one compiled model per process) "
                "or trainer.compile=false"
            )

    def wrap(
        self, model: nn.Module, ctx: DistContext, compile_mode: str | None, precision_dtype: torch.dtype | None
    ) -> nn.Module:
        model = super().wrap(model, ctx, compile_mode, precision_dtype)
        if ctx.device.type != "cuda" or len(ctx.devices) == 1:
            return model  # one device: DataParallel would call the module as it is
        if precision_dtype is not None:
            model = AutocastReplica(model, precision_dtype)
        return nn.DataParallel(model, device_ids=[d.index for d in ctx.devices])


class AutocastReplica(nn.Module):
    """DataParallel runs each replica in a thread of its own and re-enters autocast there
    without a dtype (torch/nn/parallel/parallel_apply.py), and autocast's dtype is thread-local:
    bf16-mixed would run in fp16, without loss scaling. Entering it here, inside the replica,
    keeps the dtype (GPU-only: DataParallel replicates only on CUDA)."""

    def __init__(self, module: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.module, self.dtype = module, dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, dtype=self.dtype):
            return self.module(x)


def _warn_if_sync_batchnorm_compiled(config: StrategyConfig, settings: TrainerConfig) -> None:
    if config.sync_batchnorm and settings.compile:
        log.warning(
            "strategy.sync_batchnorm=true with trainer.compile=true: every synchronised BatchNorm breaks the "
            "compiled graph (a collective per layer), so expect little gain from compiling"
        )


class DDP(Strategy):
    name = "ddp"
    process_group = True

    def check(self, settings: TrainerConfig, accelerator: Accelerator, devices: int, num_nodes: int) -> None:
        if self.config.static_graph and settings.accumulate_grad_batches > 1:
            # DDP's static-graph setup fails on a first backward under no_sync (pytorch#187732),
            # and skipping no_sync would all-reduce every micro-batch.
            raise ConfigError(
                f"strategy.static_graph=true with trainer.accumulate_grad_batches={settings.accumulate_grad_batches}: "
                "DDP's static graph cannot skip the gradient sync of accumulated micro-batches; "
                "set strategy.static_graph=false or trainer.accumulate_grad_batches=1"
            )
        _warn_if_sync_batchnorm_compiled(self.config, settings)

    def wrap(
        self, model: nn.Module, ctx: DistContext, compile_mode: str | None, precision_dtype: torch.dtype | None
    ) -> nn.Module:
        if self.config.sync_batchnorm:
            model = convert_sync_batchnorm(model, ctx.device)
        model = super().wrap(model, ctx, compile_mode, precision_dtype)
        options = self.config
        return DistributedDataParallel(
            model,
            device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
            gradient_as_bucket_view=options.gradient_as_bucket_view,
            find_unused_parameters=options.find_unused_parameters,
            static_graph=options.static_graph,
            bucket_cap_mb=options.bucket_cap_mb,
            **{SYNC_BUFFERS_ARG: options.forward_sync_buffers},
        )

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        return model.no_sync()


class FSDP(Strategy):
    """FSDP2: each rank holds 1/N of every parameter, gradient and optimizer state."""

    name = "fsdp"
    process_group = True
    sharded_checkpoint = True

    @property
    def host_collectives(self) -> bool:
        # cpu_offload keeps gradient shards in host memory (FSDP2 copies each reduced shard to the
        # CPU: torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py), so their total norm for
        # trainer.grad_clip / nonfinite=skip is an all-reduce of CPU tensors (pytorch#148532).
        return self.config.cpu_offload

    def check(self, settings: TrainerConfig, accelerator: Accelerator, devices: int, num_nodes: int) -> None:
        if settings.precision == "16-mixed":
            # GradScaler's overflow check would see only this rank's gradient shards: ranks could
            # disagree on skipping a step.
            raise ConfigError(
                "strategy=fsdp with trainer.precision=16-mixed: the loss scaler would check each rank's gradient "
                "shards alone; use trainer.precision=bf16-mixed (no loss scaling needed) or strategy=ddp"
            )
        if settings.ema_decay is not None:
            # The average would copy sharded parameters, and the sharded checkpoint's train state
            # holds no tensors of them.
            raise ConfigError(
                f"strategy=fsdp with trainer.ema_decay={settings.ema_decay}: the weights' average is not sharded yet; "
                "use strategy=ddp for EMA, or trainer.ema_decay=null"
            )
        _warn_if_sync_batchnorm_compiled(self.config, settings)

    def check_model(self, build: Callable[[], nn.Module]) -> None:
        names = self.config.shard_modules
        if names is None:
            return
        present = fsdp.module_class_names(build())
        unknown = [name for name in names if name not in present]
        if unknown:
            raise ConfigError(
                f"strategy.shard_modules names {unknown[0]}, but no module of that class holds parameters in this "
                f"model; choose from {', '.join(present)}, or null for its repeated blocks"
            )

    def wrap(
        self, model: nn.Module, ctx: DistContext, compile_mode: str | None, precision_dtype: torch.dtype | None
    ) -> nn.Module:
        if self.config.sync_batchnorm:
            model = convert_sync_batchnorm(model, ctx.device)
        # fully_shard takes contiguous parameters only; channels-last inputs alone still make the
        # convolutions run NHWC (cuDNN and oneDNN follow the input's format).
        model = model.to(memory_format=torch.contiguous_format)
        model = fsdp.shard(model, ctx, self.config, precision_dtype)
        # Compiled after sharding: dynamo leaves FSDP's hooks eager and compiles the blocks between them.
        return compiled(model, compile_mode)

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        return fsdp.accumulating(unwrap(model))


def compiled(model: nn.Module, mode: str | None) -> nn.Module:
    """torch.compile in trainer.compile_mode. reduce-overhead and max-autotune also replay each
    forward's and backward's kernels as one CUDA graph (GPU-only: inductor skips the graphs on CPU,
    torch/_inductor/cudagraph_utils.py), which pays where launching the kernels takes the CPU longer
    than the GPU takes to run them: small images, small models."""
    return model if mode is None else torch.compile(model, mode=mode)


_STRATEGIES: dict[StrategyName, type[Strategy]] = {
    StrategyName.single: Single,
    StrategyName.dp: DataParallel,
    StrategyName.ddp: DDP,
    StrategyName.fsdp: FSDP,
}


def get(config: StrategyConfig) -> Strategy:
    return _STRATEGIES[config.name](config)


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under DP/DDP and torch.compile: state_dict keys carry no `module.` or
    `_orig_mod.` prefix, so a checkpoint loads under any strategy. FSDP shards the module in
    place: it is its own plain module, with DTensor parameters."""
    if isinstance(model, (DistributedDataParallel, nn.DataParallel)):
        model = model.module
    if isinstance(model, AutocastReplica):
        model = model.module
    return getattr(model, "_orig_mod", model)  # torch.compile's OptimizedModule


def for_evaluation(model: nn.Module) -> nn.Module:
    """The module evaluation runs: DataParallel as it is, splitting each batch over its GPUs as in
    training; anything else unwrapped (DDP's forward would sync buffers across ranks whose
    validation shards differ in length)."""
    return model if isinstance(model, nn.DataParallel) else unwrap(model)


def prepare_evaluation(model: nn.Module, batches: int, ctx: DistContext) -> int:
    """FSDP all-gathers parameters in every forward, so ranks must run their forwards together:
    how many empty ones this rank adds to match the busiest rank's `batches` (0 without FSDP).

    Each rank's BatchNorm statistics follow its own data: FSDP never syncs buffers, and DDP copies
    rank 0's at the start of each forward, so the last training forward leaves every rank its
    own. The EMA's averages of them differ too. Every rank takes rank 0's first, which checkpoints
    save, so that the model evaluated is the model saved.
    """
    broadcast_from_main(list(model.buffers()), ctx)
    if not gathers_in_forward(model):
        return 0
    most, fewest = all_reduce_max(torch.tensor([batches, -batches], device=ctx.device), ctx).tolist()
    if -fewest == 0:
        raise RuntimeError(
            "strategy=fsdp: a rank has no validation batch (fewer validation samples than ranks), so it "
            "cannot take part in the others' forwards; use fewer trainer.devices or a larger validation split"
        )
    return most - batches


def gathers_in_forward(model: nn.Module) -> bool:
    """A forward is a collective (FSDP): no rank may run one alone."""
    return fsdp.is_sharded(unwrap(model))

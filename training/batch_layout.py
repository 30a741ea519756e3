"""How the batches lie on the world: each rank's micro-batch, and how many of them an optimizer step
accumulates. trainer.batch_size is the global batch and an optimizer step takes
trainer.accumulate_grad_batches of them; a rank whose share of a batch would exceed
trainer.max_batch_per_device trains it as `split` smaller micro-batches, accumulated too. So

    micro-batch x accumulation x world = batch_size x accumulate_grad_batches

at any world, and a torchrun re-form at another size (`--nnodes=MIN:MAX`) keeps what an optimizer
step learns from. Which samples it learns from stays too: DistributedSampler gives rank r positions
r, r + W, r + 2W, ... of the epoch's order, so the world's j-th micro-batches together are positions
j x micro x W up to (j + 1) x micro x W, and an optimizer step's are one contiguous run of the order,
the same at any world and accumulation. (The epoch's end differs: the sampler pads the order to a
multiple of the world, and the last step may take fewer micro-batches.)"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from config.schema import TrainerConfig

log = logging.getLogger("train")


@dataclass(frozen=True)
class BatchLayout:
    world_size: int
    micro_batch: int  # each rank's training samples per forward
    split: int  # micro-batches per batch of trainer.batch_size
    accumulate: int  # micro-batches per optimizer step
    val_micro_batch: int  # each rank's validation samples per forward
    val_split: int  # validation batches per batch of trainer.val_batch_size (or batch_size)

    @classmethod
    def of(cls, settings: TrainerConfig, world_size: int, devices_per_rank: int = 1) -> BatchLayout:
        """`devices_per_rank`: the GPUs a strategy=dp process splits its micro-batch over. The
        pre-flight has checked that batch_size splits evenly over `world_size`."""
        limit = _limit(settings, devices_per_rank)
        share = settings.batch_size // world_size
        val_share = (settings.val_batch_size or settings.batch_size) // world_size
        split, val_split = _split(share, limit), _split(val_share, limit)
        return cls(
            world_size,
            share // split,
            split,
            settings.accumulate_grad_batches * split,
            val_share // val_split,
            val_split,
        )

    @property
    def samples(self) -> int:
        """The world's training samples per micro-batch."""
        return self.micro_batch * self.world_size

    @property
    def val_samples(self) -> int:
        return self.val_micro_batch * self.world_size

    def loop_settings(self, settings: TrainerConfig) -> TrainerConfig:
        """`settings` in the loop's units, this layout's micro-batches: the batches, the accumulation,
        and the batch limits (which count batches of trainer.batch_size, or of the validation batch)."""

        def times(batches: int | None, split: int) -> int | None:
            return None if batches is None else batches * split

        # The batches in these units too, so that batch x accumulation stays an optimizer step's
        # samples: `replace` checks the settings again, and the EMA's adjusted decay would count a
        # step's samples `split` times over (and refuse a decay the run's own keys allow).
        return replace(
            settings,
            batch_size=self.samples,
            val_batch_size=self.val_samples,
            accumulate_grad_batches=self.accumulate,
            limit_train_batches=times(settings.limit_train_batches, self.split),
            overfit_batches=times(settings.overfit_batches, self.split),
            limit_val_batches=times(settings.limit_val_batches, self.val_split),
        )

    def underfilled(self, settings: TrainerConfig, devices_per_rank: int = 1) -> str | None:
        """A line when each rank's share of a batch splits evenly only into micro-batches of less than
        half of trainer.max_batch_per_device (a prime share: into micro-batches of 1), which leave the
        device mostly idle; it names the nearest larger global batch that splits into full ones."""
        limit = _limit(settings, devices_per_rank)
        if limit is None or 2 * self.micro_batch >= limit:
            return None
        share = self.micro_batch * self.split
        fills = -(-share // limit) * limit * self.world_size  # a share that is a multiple of the limit
        return (
            f"trainer.batch_size={settings.batch_size} gives each rank {share} samples, "
            f"which split evenly only into {self.split} micro-batches of {self.micro_batch} under "
            f"trainer.max_batch_per_device={settings.max_batch_per_device}: slow; trainer.batch_size={fills} "
            "fills them"
        )

    def describe(self) -> str:
        per_step = "1 micro-batch" if self.accumulate == 1 else f"{self.accumulate} micro-batches"
        return f"{per_step} of {self.micro_batch} per rank"


def _limit(settings: TrainerConfig, devices_per_rank: int) -> int | None:
    """A rank's samples per forward at most: trainer.max_batch_per_device, over a strategy=dp
    process's GPUs; None: no limit."""
    limit = settings.max_batch_per_device
    return None if limit is None else limit * devices_per_rank


def _split(share: int, limit: int | None) -> int:
    """The fewest equal parts of `share` that each fit within `limit` (parts of unequal size would
    weigh their samples unequally in the accumulated mean)."""
    if limit is None:
        return 1
    return next(parts for parts in range(1, share + 1) if share % parts == 0 and share // parts <= limit)


def carry_over(position: int, saved: BatchLayout | None, layout: BatchLayout) -> int:
    """A checkpoint's position in its epoch (the micro-batches of `saved`'s layout done) in
    `layout`'s micro-batches, and a change of layout said in one line. A mid-epoch save is at an
    optimizer step's end, whose samples both layouts count alike; an epoch's end, padded to the
    world's multiple, rounds up to this layout's end of the epoch."""
    if saved is None or saved == layout:  # a checkpoint of before layouts were saved: this world's
        return position
    log.info(  # rank 0's: the others only warn
        "world size %d -> %d (the checkpoint's -> this run's): an optimizer step's %d samples were %s, now %s%s; "
        "each rank draws its own random numbers (dropout, augmentations), so those differ from here",
        saved.world_size,
        layout.world_size,
        layout.samples * layout.accumulate,
        saved.describe(),
        layout.describe(),
        f", and the epoch goes on after its first {position * saved.samples} samples" if position else "",
    )
    return -(-position * saved.samples // layout.samples)

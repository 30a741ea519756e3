"""Lightning's side of bench.peers: the peers job as a LightningModule, run by `lightning.Trainer`.

python -m bench.peers_lightning --model simple_cnn --channels 3 --image-size 32 --batch-size 128 \
    --max-steps 40 --root DIR

What a Lightning user writes for the job, with the Trainer's defaults kept: TensorBoard logger,
progress bar, model summary, a ModelCheckpoint each epoch and a validation pass each epoch
(`limit_val_batches=1`: the job's one validation batch). Data: random tensors in memory, as
train.py's `dataset=synthetic`, through a plain DataLoader. Prints bench.startup's marker to stdout
right after the first optimizer step, so both benchmarks clock it as they clock train.py.
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from bench.common import FIRST_STEP
from bench.plain_loop import NETS, SGD, add_job_arguments


class Classifier(L.LightningModule):
    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        loss = F.cross_entropy(logits, y)
        self.log("train/loss", loss)
        self.log("train/acc", (logits.argmax(1) == y).float().mean())
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        self.log("val/loss", F.cross_entropy(logits, y))
        self.log("val/acc", (logits.argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), **SGD)


class FirstStep(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        # on_train_batch_end follows the optimizer step in automatic optimisation.
        if trainer.global_step == 1 and batch_idx == 0:
            print(FIRST_STEP, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_job_arguments(parser)
    parser.add_argument("--train-size", type=int, default=2048)
    parser.add_argument("--val-size", type=int, default=512)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--root", required=True, help="Trainer(default_root_dir): logs and checkpoints")
    args = parser.parse_args()

    generator = torch.Generator().manual_seed(0)
    shape = (args.channels, args.image_size, args.image_size)
    data = [
        TensorDataset(
            torch.randn(n, *shape, generator=generator), torch.randint(0, args.classes, (n,), generator=generator)
        )
        for n in (args.train_size, args.val_size)
    ]
    model = Classifier(NETS[args.model](args.channels, args.classes, args.image_size))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=args.max_steps,
        limit_val_batches=1,
        default_root_dir=args.root,
        callbacks=[FirstStep()],
    )
    trainer.fit(
        model,
        DataLoader(data[0], batch_size=args.batch_size, shuffle=True),
        DataLoader(data[1], batch_size=args.batch_size),
    )


if __name__ == "__main__":
    main()

"""DDP on CPU with 2 gloo processes: every replica ends with the same weights."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from distributed import context
from distributed.context import DistContext
from distributed.launch import launch
from train import check
from training.run import train
from tests.conftest import compose_config

pytestmark = pytest.mark.slow


def _train_and_dump(ctx: DistContext, cfg, out: str) -> None:
    """training.run.run, keeping each rank's final weights for the test to compare."""
    context.init(ctx, cfg.launcher.timeout_s)
    try:
        model = train(ctx, cfg, Path(out), {"model": "m", "dataset": "d", "strategy": "ddp"})
        torch.save(model.state_dict(), Path(out) / f"rank{ctx.rank}.pt")
        del model
    finally:
        context.shutdown(ctx, clean=True)


def test_ddp_replicas_end_bitwise_identical(tmp_path):
    cfg = compose_config(
        "strategy=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.epochs=1",
        "trainer.limit_train_batches=10", "trainer.progress_bar=false",
    )
    launch(check(cfg), _train_and_dump, cfg, str(tmp_path))
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2))
    saved = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)["model"]
    for key in rank0:
        assert torch.equal(rank0[key], rank1[key]), key
        assert torch.equal(rank0[key], saved[key]), key

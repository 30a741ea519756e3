"""Every model trains on every dataset: channels, classes and size come from the dataset config."""
from __future__ import annotations

import json
import math

import pytest
import torch

from distributed.context import make_context
from training import run as run_job
from tests.conftest import job_config

# The ResNets take tens of seconds each on 2 cores (45 s for resnet50 in a loaded suite run): slow.
MODELS = ["simple_cnn", "mnist_net", *(pytest.param(m, marks=pytest.mark.slow) for m in ("resnet18", "resnet50"))]
DATASETS = ["digits", "synthetic"]
TINY = ["debug=fdr", "trainer.batch_size=4", "dataset.train_size=16", "dataset.val_size=8"]


def _tiny(dataset: str) -> list[str]:
    # digits has a fixed size; synthetic is shrunk to a few samples
    return [o for o in TINY if dataset == "synthetic" or not o.startswith("dataset.")]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("dataset", DATASETS)
def test_every_model_trains_on_every_dataset(model, dataset, tmp_path):
    job = job_config(tmp_path, f"model={model}", f"dataset={dataset}", *_tiny(dataset))
    ctx = make_context(0, 0, 1, 1, "cpu", use_process_group=False)
    torch.manual_seed(job.trainer.seed)
    before = job.model().state_dict()
    trained = run_job.train(ctx, job)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert math.isfinite(metrics["train_loss"]) and metrics["steps"] == 3
    changed = [k for k, v in trained.state_dict().items() if v.is_floating_point() and not torch.equal(v, before[k])]
    assert changed, "three optimizer steps changed no parameter"
    x = torch.zeros(3, job.dataset.channels, job.dataset.image_size, job.dataset.image_size)
    assert trained.eval()(x).shape == (3, job.dataset.num_classes)

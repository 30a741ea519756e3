"""docs/EXTENDING.md as written: every code block it shows is in the file it names, and its examples
(Fashion-MNIST, a tiny ViT, the focal loss, the grad-norm callback) train through `python train.py`,
so the guide cannot drift (tests/test_docs.py composes each of its commands)."""

from __future__ import annotations

import itertools
import json
import re
import shlex

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from config.setup import ROOT
from data.fashion_mnist import FASHION_MNIST
from tests.dataset_files import write_idx
from tests.runs import run_train

GUIDE = ROOT / "docs" / "EXTENDING.md"


def _blocks() -> list[tuple[str, str, str]]:
    """(language, code, the line before it) of each fenced block of the guide."""
    return [
        (lang, code, before)
        for before, lang, code in re.findall(r"([^\n]*)\n\n```(\w+)\n(.*?)\n```", GUIDE.read_text(), flags=re.S)
    ]


@pytest.mark.parametrize("lang, code, before", [b for b in _blocks() if b[0] in ("python", "yaml")])
def test_each_code_block_of_the_guide_is_in_the_file_it_names(lang, code, before):
    named = [path for path in re.findall(r"`([\w./]+)`", before) if (ROOT / path).is_file()]
    assert named and before.endswith("`:"), f"say which file this block is from, as `path`: ({before!r})"
    assert code in (ROOT / named[-1]).read_text(), f"{named[-1]} no longer holds the guide's block:\n{code}"


@pytest.mark.slow
def test_the_guides_dataset_and_model_train_through_train_py(tmp_path):
    root = tmp_path / "data"
    write_idx(root, train=64, val=32, gz=True, dataset=FASHION_MNIST)  # as torchvision downloads them
    result = run_train(
        tmp_path / "run",
        "dataset=fashion_mnist",
        f"dataset.root={root}",
        "dataset.download=false",
        "model=vit_tiny",
        "trainer.epochs=1",
        "trainer.batch_size=16",
        "data.loader=device",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert (metrics["dataset"], metrics["model"], metrics["steps"]) == ("fashion_mnist", "vit_tiny", 4)


def _commands(section: str) -> list[list[str]]:
    """The overrides of each `python train.py ...` line of a section's bash blocks, a -m sweep
    expanded into its jobs."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    text = GUIDE.read_text()
    start = text.index(f"\n{section}\n")
    end = text.find("\n## ", start + 1)
    jobs = []
    for block in re.findall(r"```bash\n(.*?)\n```", text[start : end if end >= 0 else None], flags=re.S):
        for line in block.splitlines():
            words = shlex.split(line.split("#")[0])
            if words[:2] != ["python", "train.py"]:
                continue
            parsed = OverridesParser.create().parse_overrides([w for w in words[2:] if w != "-m"])
            values = [
                [_choice(o.key_or_group, v) for v in o.sweep_iterator()] if o.is_sweep_override() else [o.input_line]
                for o in parsed
            ]
            jobs += [list(job) for job in itertools.product(*values)]
    return jobs


def _choice(key: str, value: str | list[str]) -> str:
    return f"{key}=[{','.join(value)}]" if isinstance(value, list) else f"{key}={value}"


@pytest.mark.slow
def test_the_guides_loss_and_metric_train_through_train_py(run_dir):
    """One short run with the first command of each recipe: the focal loss trains and validates
    (below cross-entropy, which it down-weighs), and train/grad_norm reaches TensorBoard each epoch."""
    loss, metric = (_commands(section)[0] for section in ("## A loss", "### A logged metric"))
    result = run_train(
        run_dir, *loss, *metric, "trainer.epochs=2", "trainer.limit_train_batches=4", "trainer.limit_val_batches=2"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert 0 < metrics["val_loss"] < metrics["val_ce"]
    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/grad_norm")] == [4, 8]
    assert all(e.value > 0 for e in events.Scalars("train/grad_norm"))


@pytest.mark.slow
def test_the_guides_validation_metric_and_stopping_rule_train_through_train_py(run_dir):
    """The first command of each recipe, in one run (their callbacks as a list): val/balanced_acc
    reaches metrics.json and chooses best.pt, and stop_at ends the run at the first validation that
    reaches its value (lowered here, so that it is the first)."""
    metric, stopping = (
        _commands(section)[0] for section in ("### A metric over the validation set", "### Stopping early")
    )
    chosen = [o.split("=", 1)[1] for o in [*metric, *stopping] if o.startswith("callbacks=")]
    rest = [o for o in [*metric, *stopping] if not o.startswith(("callbacks=", "trainer.epochs="))]
    result = run_train(
        run_dir,
        f"callbacks=[{','.join(chosen)}]",
        *rest,
        "callbacks.stop_at.value=0.1",
        "trainer.epochs=3",
        "trainer.limit_train_batches=4",
        "trainer.limit_val_batches=2",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["epochs"] == 1 and metrics["stopped_early"].startswith("stop_at: val/acc reached 0.1 (")
    assert 0 < metrics["val_balanced_acc"] <= 1
    best = torch.load(run_dir / "checkpoints" / "best.pt", weights_only=True)["best_checkpoints"]
    assert best["monitor"] == "val/balanced_acc" and best["kept"][0]["value"] == metrics["val_balanced_acc"]

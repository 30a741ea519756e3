"""docs/EXTENDING.md as written: every code block it shows is in the file it names, and its examples
(Fashion-MNIST, a tiny ViT) train through `python train.py`, so the guide cannot drift."""
from __future__ import annotations

import json
import re

import pytest

from config.setup import ROOT
from data.fashion_mnist import FASHION_MNIST
from tests.dataset_files import write_idx
from tests.runs import run_train

GUIDE = ROOT / "docs" / "EXTENDING.md"


def _blocks() -> list[tuple[str, str, str]]:
    """(language, code, the line before it) of each fenced block of the guide."""
    return [(lang, code, before) for before, lang, code in
            re.findall(r"([^\n]*)\n\n```(\w+)\n(.*?)\n```", GUIDE.read_text(), flags=re.S)]


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
        tmp_path / "run", "dataset=fashion_mnist", f"dataset.root={root}", "dataset.download=false",
        "model=vit_tiny", "trainer.epochs=1", "trainer.batch_size=16", "data.loader=device",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert (metrics["dataset"], metrics["model"], metrics["steps"]) == ("fashion_mnist", "vit_tiny", 4)

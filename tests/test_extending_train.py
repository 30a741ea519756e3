"""docs/EXTENDING.md's loss and logged-metric recipes, held to the code: each block that names a
file is in that file, each command composes, and the examples train through train.py."""
from __future__ import annotations

import itertools
import json
import re
import shlex

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from config.setup import ROOT, compose
from tests.runs import run_train

SECTIONS = ("## A loss", "## A logged metric")


def _blocks(section: str) -> list[tuple[str, str, str]]:
    """(language, the file it names or "", text) of each fenced block of a section of the guide."""
    guide = (ROOT / "docs" / "EXTENDING.md").read_text()
    start = guide.index(section + "\n")
    end = guide.find("\n## ", start + len(section))
    body = guide[start:end if end >= 0 else None]
    return [(m[1], m[2] or "", m[3]) for m in re.finditer(r"^```(\w+) ?(\S*)\n(.*?)^```$", body, re.S | re.M)]


def _commands(section: str) -> list[list[str]]:
    """The overrides of each `python train.py ...` line of a section, a -m sweep expanded into its jobs."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    jobs = []
    for language, _, text in _blocks(section):
        for line in text.splitlines() if language == "bash" else []:
            words = shlex.split(line.split("#")[0])
            if words[:2] != ["python", "train.py"]:
                continue
            overrides = [w for w in words[2:] if w != "-m"]
            parsed = OverridesParser.create().parse_overrides(overrides)
            values = [[_choice(o.key_or_group, v) for v in o.sweep_iterator()] if o.is_sweep_override()
                      else [o.input_line] for o in parsed]
            jobs += [list(job) for job in itertools.product(*values)]
    return jobs


def _choice(key: str, value: str | list[str]) -> str:
    return f"{key}=[{','.join(value)}]" if isinstance(value, list) else f"{key}={value}"


@pytest.mark.parametrize("section", SECTIONS)
def test_each_block_that_names_a_file_is_in_that_file(section):
    named = [(path, text) for _, path, text in _blocks(section) if path]
    assert len(named) == 2, named  # the code and its config: the recipe's two files
    for path, text in named:
        assert text in (ROOT / path).read_text(), f"docs/EXTENDING.md's {section!r} block is not in {path}"


def test_each_command_composes():
    jobs = {section: _commands(section) for section in SECTIONS}
    assert [len(j) for j in jobs.values()] == [3, 4], jobs  # a -m sweep is two jobs
    losses = {"focal": "training.loss.FocalLoss", "cross_entropy": "training.loss.CrossEntropy"}
    for (override,) in {tuple(job) for job in itertools.chain(*jobs.values())}:
        cfg = compose(override)
        key, value = override.split("=", 1)
        if key == "loss":
            assert cfg.loss._target_ == losses[value]
        else:
            assert list(cfg.callbacks) == [name for name in value.strip("[]").split(",") if name]


def test_the_focal_loss_and_grad_norm_examples_train(run_dir):
    """One short run with the first command of each recipe: the focal loss trains and validates
    (below cross-entropy, which it down-weighs), and train/grad_norm reaches TensorBoard each epoch."""
    loss, metric = (_commands(section)[0] for section in SECTIONS)
    result = run_train(run_dir, *loss, *metric, "trainer.epochs=2", "trainer.limit_train_batches=4",
                       "trainer.limit_val_batches=2")
    assert result.returncode == 0, result.stderr
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert 0 < metrics["val_loss"] < metrics["val_ce"]
    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/grad_norm")] == [4, 8]
    assert all(e.value > 0 for e in events.Scalars("train/grad_norm"))

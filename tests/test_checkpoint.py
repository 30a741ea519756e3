"""Checkpoints are written atomically and load with weights_only=True."""
from __future__ import annotations

import pytest
import torch

from errors import ConfigError
from training.checkpoint import load_checkpoint, save_checkpoint


def test_save_replaces_atomically_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "ckpt" / "last.pt"
    save_checkpoint({"model": {"w": torch.ones(2)}, "epoch": 1, "config": "a: 1\n"}, path)
    save_checkpoint({"model": {"w": torch.zeros(2)}, "epoch": 2, "config": "a: 1\n"}, path)
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]
    loaded = load_checkpoint(path, torch.device("cpu"))
    assert loaded["epoch"] == 2 and torch.equal(loaded["model"]["w"], torch.zeros(2))


def test_a_failed_save_leaves_the_previous_file_intact(tmp_path):
    path = tmp_path / "last.pt"
    save_checkpoint({"epoch": 1}, path)
    before = path.read_bytes()
    with pytest.raises(Exception):
        save_checkpoint({"epoch": 2, "bad": lambda: None}, path)  # lambdas cannot be pickled
    assert path.read_bytes() == before


def test_truncated_checkpoint_is_a_one_line_error(tmp_path):
    path = tmp_path / "last.pt"
    save_checkpoint({"model": {"w": torch.ones(1000)}}, path)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ConfigError, match="not a loadable checkpoint"):
        load_checkpoint(path, torch.device("cpu"))

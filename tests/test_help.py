"""`python train.py --help` and `--cfg job`: what a newcomer reads before the first run."""

from __future__ import annotations

import re

from omegaconf import OmegaConf

from config.setup import CONF_DIR, RESOLVERS, compose
from tests import train_server


def _section(text: str, title: str) -> list[str]:
    """The lines under `== <title>... ==`, up to the next heading."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"== {title}"))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("== ")), len(lines))
    return [line for line in lines[start + 1 : end] if line.strip()]


def test_help_says_what_this_is_lists_every_group_and_the_keys_it_names_exist():
    overrides = ["optimizer=adamw", "trainer.gpus=2"]
    result = train_server.run(["--help", *overrides])
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert text.startswith("train.py: train an image classifier") and "powered by Hydra" not in text
    # Every group under conf/ with every option, as Hydra lists them: a new group or option shows unasked.
    groups = {line.split(": ")[0]: line.split(": ")[1].split(", ") for line in _section(text, "Groups")}
    assert groups == {
        d.name: sorted(f.stem for f in d.glob("*.yaml")) for d in CONF_DIR.iterdir() if d.is_dir() and d.name != "hydra"
    }
    # Ten keys, each one the config has, each shown with the value this command would use, as spelled.
    cfg = compose(*overrides)
    keys = _section(text, "The keys people change most")
    assert len(keys) == 10
    shown = {}
    for line in keys:
        key, shown[key] = re.fullmatch(r"  (\S+) +.*\(now (.*)\)", line).groups()
        value = OmegaConf.select(cfg, key, default=KeyError, throw_on_missing=True)
        assert value is not KeyError and shown[key] == RESOLVERS["spelled"](key, _root_=cfg), line
    assert [shown[k] for k in ("optimizer.lr", "trainer.gpus", "trainer.accelerator", "trainer.resume")] == [
        "0.001",
        "2",
        "auto",
        "null",
    ]  # as a config spells them, not Python's None or Accelerator.auto
    for words in (
        "python train.py --cfg job --resolve",
        "README.md",
        "docs/",
        "python train.py -m",
        "config/schema.py",
    ):
        assert words in text


def test_cfg_job_shows_what_a_computed_value_is_worked_out_from_and_resolve_shows_the_value():
    cfg = compose("trainer.epochs=7", "scheduler.warmup_epochs=2")
    as_written = OmegaConf.to_yaml(cfg)  # python train.py --cfg job
    assert "T_max: ${epochs_after_warmup:${trainer.epochs},${scheduler.warmup_epochs}}" in as_written
    resolved = OmegaConf.to_yaml(cfg, resolve=True)  # --cfg job --resolve
    assert "T_max: 5\n" in resolved and "${" not in resolved and "???" not in resolved
    everything = compose("optimizer.lr=0.0302852", hydra=True)
    OmegaConf.resolve(everything)  # --cfg all --resolve, as Hydra prints it
    unknown = {
        line.split(":")[0].strip() for line in OmegaConf.to_yaml(everything).splitlines() if line.endswith(": ???")
    }
    assert unknown == {"filename", "hydra_help", "id", "num", "output_dir"}  # Hydra's own, filled in per job
    assert everything.hydra.sweep.subdir == "<job number>_optimizer.lr-0.03029"  # ours says what it lacks

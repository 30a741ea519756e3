"""What runs are compared by (config.hparams): each run's record, resolved, and what differs between records."""

from __future__ import annotations

import yaml

from config.hparams import _varied_hparams, differing, hparams
from config.setup import compose


def test_a_record_holds_every_value_the_run_used_resolved_and_spelled_as_the_config_spells_it():
    cfg = compose("model=simple_cnn", "optimizer=adamw", "dataset.image_size=8", hydra=True)
    record = hparams(cfg, cfg.hydra.runtime.choices)
    assert list(record)[:6] == ["model", "dataset", "strategy", "optimizer", "scheduler", "loss"]  # the groups first
    assert (record["optimizer"], record["optimizer.weight_decay"], record["optimizer.lr"]) == ("adamw", 0.01, 0.001)
    assert record["model.num_classes"] == 10  # ${dataset.num_classes}, resolved
    assert (record["trainer.accelerator"], record["dataset.mean"]) == (
        "auto",
        "[0.3053]",
    )  # an Enum's name, a list as JSON
    assert isinstance(record["trainer.batch_size"], int) and record["trainer.compile"] is False
    # Neither Hydra's keys (the option names the class), nor where a run reads, writes and logs, nor an unset key.
    assert not [k for k in record if "_target_" in k or k.split(".")[0] in ("paths", "launcher", "logger", "hydra")]
    assert "trainer.resume" not in record and "trainer.max_steps" not in record  # null


def test_records_differ_in_a_key_one_lacks_and_in_a_value_as_typed_not_as_written():
    records = [
        {"optimizer": "sgd", "optimizer.momentum": 0.9, "trainer.epochs": 3, "trainer.compile": True},
        {"optimizer": "adamw", "trainer.epochs": 3.0, "trainer.compile": 1},
    ]
    assert differing(records) == {
        "optimizer": ("sgd", "adamw"),
        "optimizer.momentum": (0.9,),  # adamw has none
        "trainer.compile": (True, 1),  # a flag is no number
    }  # 3 and 3.0: one value
    assert differing(records[:1]) == {} and differing([]) == {}


def test_a_sweeps_jobs_differ_in_what_each_used_joined_by_their_figures_an_intervals_values_unknown():
    # multirun.yaml as `python train.py -m optimizer=sgd,adamw 'optimizer.lr=interval(0.01,0.1)'` writes it.
    task = ["optimizer=sgd,adamw", "optimizer.lr=interval(0.01,0.1)", "trainer.epochs=2"]
    record = yaml.safe_dump({"hydra": {"sweeper": {"params": None}, "overrides": {"task": task}}})
    # A figure of each job beside its config (train.py gives its model summary: preflight.model_figures).
    varied = _varied_hparams(record, lambda cfg: {"has_momentum": "momentum" in cfg.optimizer})
    # weight_decay differs by each optimizer's defaults: nothing on the command line says so.
    assert varied == {
        "optimizer": ("sgd", "adamw"),
        "optimizer.momentum": (0.9,),
        "optimizer.weight_decay": (0.0005, 0.01),
        "optimizer.nesterov": (True,),
        "has_momentum": (True, False),
        "optimizer.lr": (),  # sampled: its values are not known ahead (the two composed ones would say 0.05, 0.001)
    }

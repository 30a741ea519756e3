"""Callbacks that steer: validation's events, a stop every rank agrees on, a callback's state in the
checkpoint, the best checkpoints by any figure, early stopping and the confusion matrix; monitors
checked before launch. Units on a Trainer in this process; the built-in options end to end under
DDP(2) and FSDP(2), killed with -9 and resumed (at another world size for DDP)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import preflight
from config.overrides import check_overrides
from config.setup import CONF_DIR
from errors import ConfigError
from preflight import check_and_plan
from tests.configs import typed_config
from tests.faults import NumpyState
from tests.runs import resume_point, run_train
from tests.test_callbacks import Scalars, _loaders
from tests.test_train_step import TinyNet, _trainer
from training.callbacks import Callback
from training.callbacks.confusion_matrix import draw, scores
from training.callbacks.early_stopping import EarlyStopping
from training.checkpoint import sharded
from training.checkpoint.best import BEST, BestCheckpoints, Plan
from training.checkpoint.files import save_checkpoint
from training.monitor import Monitor, better_way
from training.trainer import Reporting


class StopAt(Callback):
    """Adds val/mine each validation, and asks to stop at epoch `epoch`."""

    figures = ("val/mine",)

    def __init__(self, epoch: int) -> None:
        self.epoch, self.seen = epoch, 0

    def on_validation_end(self, epoch: int, step: int, figures: dict[str, float]) -> str | None:
        self.seen += 1
        figures["val/mine"] = 0.25 * (epoch + 1)
        return f"enough at epoch {epoch + 1}" if epoch == self.epoch else None

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen = state["seen"]


def test_a_stop_ends_the_run_at_that_epoch_saved_says_why_and_a_resume_trains_nothing(tmp_path, caplog):
    logger, stopper = Scalars(), StopAt(epoch=1)
    trainer = _trainer(TinyNet(), tmp_path, loaders=_loaders(), reporting=Reporting([logger], [stopper]), epochs=5)
    trainer.checkpointer.callbacks = {"stop": stopper}
    with caplog.at_level(logging.INFO, logger="train"):
        metrics = trainer.fit()
    trainer.checkpointer.close()
    assert (metrics["epochs"], metrics["stopped_early"]) == (2, "enough at epoch 2")
    # What the callback added: to the loggers, metrics.json's figures and the epoch's line.
    assert logger.scalars["val/mine"] == [(3, 0.25), (6, 0.5)] and metrics["val_mine"] == 0.5
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("epoch 2/5 ") and line.endswith("val/mine 0.5000") for line in lines)
    assert "stopping early at step 6: enough at epoch 2; last.pt is saved" in lines
    saved = torch.load(tmp_path / "last.pt", weights_only=True)
    assert (saved["epoch"], saved["stopped"], saved["callbacks"]) == (2, "enough at epoch 2", {"stop": {"seen": 2}})
    # Resumed: the state comes back, and nothing is trained.
    again = StopAt(epoch=1)
    resumed = _trainer(TinyNet(), tmp_path, loaders=_loaders(), reporting=Reporting((), [again]), epochs=5)
    resumed.checkpointer.callbacks = {"stop": again}
    resumed.state = resumed.checkpointer.restore(resume_point(tmp_path / "last.pt"))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="train"):
        assert resumed.fit() == {}
    assert again.seen == 2 and resumed.state.step == 6
    assert "nothing to train: the run stopped early, at epoch 2 (enough at epoch 2)" in caplog.messages


def test_a_callback_state_no_checkpoint_could_load_stops_the_first_save_in_one_line(tmp_path):
    # Saved as it was, every checkpoint of the run would be refused by a resume, predict.py and export.py.
    keeper = NumpyState()
    trainer = _trainer(TinyNet(), tmp_path, loaders=_loaders(), reporting=Reporting((), [keeper]), epochs=2)
    trainer.checkpointer.callbacks = {"numpy": keeper}
    with pytest.raises(ConfigError) as refused:
        trainer.fit()
    trainer.checkpointer.close()
    message = str(refused.value)
    assert message.startswith("callbacks.numpy: its state_dict() holds a numpy.") and "\n" not in message
    assert not (tmp_path / "last.pt").exists()


@pytest.mark.slow
def test_a_callback_state_no_checkpoint_could_load_is_one_line_through_train_py(run_dir):
    result = run_train(run_dir, "debug=fdr", "+callbacks.numpy._target_=tests.faults.NumpyState")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: callbacks.numpy: its state_dict() holds a numpy.") and line.endswith(
        "which a checkpoint cannot hold (they load with weights_only=True); give tensors and Python's own numbers, "
        "strings, lists and dicts (float(x), x.tolist(), torch.as_tensor(x))"
    )
    assert not (run_dir / "checkpoints" / "last.pt").exists()


def test_early_stopping_waits_its_patience_beyond_min_delta_and_resumes_its_count():
    stopping = EarlyStopping(monitor="val/loss", mode="min", patience=2, min_delta=0.1)
    losses = [1.0, 0.95, 0.85, 0.9, 0.8]  # 0.95 is within min_delta of 1.0; 0.85 beats it by more
    reasons = [stopping.on_validation_end(epoch, 0, {"val/loss": loss}) for epoch, loss in enumerate(losses[:2])]
    assert reasons == [None, None] and stopping.waited == 1
    resumed = EarlyStopping(monitor="val/loss", mode="min", patience=2, min_delta=0.1)
    resumed.load_state_dict(stopping.state_dict())
    assert resumed.on_validation_end(2, 0, {"val/loss": 0.85}) is None and resumed.waited == 0
    assert resumed.on_validation_end(3, 0, {"val/loss": 0.9}) is None
    reason = resumed.on_validation_end(4, 0, {"val/loss": 0.8})  # not by more than 0.1
    assert reason == (
        "early_stopping: val/loss has not improved on its best by more than 0.1 for 2 validation(s) "
        "(best 0.85 at epoch 3)"
    )
    maximum = EarlyStopping(monitor="val/acc", mode="max", patience=1)
    assert maximum.on_validation_end(0, 0, {"val/acc": 0.5}) is None
    assert maximum.on_validation_end(1, 0, {"val/acc": 0.6}) is None
    assert maximum.on_validation_end(2, 0, {"val/acc": 0.6}) is not None  # a tie is no improvement


@pytest.mark.parametrize(
    "values, kept, files",
    [
        ([0.5, 0.7, 0.6, 0.8, 0.4], [0.8, 0.7], {BEST: 0.8, "best-epoch2-step2.pt": 0.7}),
        ([0.5, 0.5, 0.4], [0.5, 0.5], {BEST: 0.5, "best-epoch2-step2.pt": 0.5}),  # the first 0.5 stays best
    ],
)
def test_the_k_best_checkpoints_by_a_figure_best_pt_the_best_of_them(tmp_path, values, kept, files):
    best = BestCheckpoints(Monitor("val/acc", "max"), top_k=2)
    for epoch, value in enumerate(values, start=1):
        plan = best.offer(value, epoch, epoch)
        for name in plan.drop:
            (tmp_path / name).unlink()
        if plan.link:
            (tmp_path / plan.link[1]).write_bytes((tmp_path / plan.link[0]).read_bytes())
        if plan.write:
            (tmp_path / plan.write).write_text(str(value))
    assert [k.value for k in best.kept] == kept
    assert {p.name: float(p.read_text()) for p in tmp_path.iterdir()} == files
    assert best.kept[0].epoch == values.index(kept[0]) + 1


def test_one_best_checkpoint_is_replaced_in_place_and_each_records_whose_weights_scored_it():
    best = BestCheckpoints(Monitor("val/acc", "max"), top_k=1)
    assert best.offer(0.5, 1, 10) == Plan(write=BEST)
    # k = 1: the new best.pt replaces the old; nothing to link it away to, nothing to drop.
    assert best.offer(0.7, 2, 20, weights="ema") == Plan(write=BEST)
    assert [(k.value, k.weights) for k in best.kept] == [(0.7, "ema")]
    two = BestCheckpoints(Monitor("val/acc", "max"), top_k=2)
    two.offer(0.5, 1, 10)
    assert two.offer(0.7, 2, 20) == Plan(write=BEST, link=(BEST, "best-epoch1-step10.pt"))
    assert [k.weights for k in two.kept] == ["model", "model"]  # the model's, unless given


def test_a_min_monitor_keeps_the_lowest_and_a_resumed_ranking_goes_on(tmp_path):
    saver = _trainer(TinyNet(), tmp_path, loaders=_loaders(), epochs=1)
    checkpointer = saver.checkpointer
    checkpointer.best = BestCheckpoints(Monitor("val/loss", "min"), top_k=2)
    for epoch, loss in enumerate([0.9, 0.5, 0.7], start=1):
        saver.state.epoch, saver.state.step = epoch, epoch
        checkpointer.save(saver.state, loss)
    checkpointer.close()
    names = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("."))
    assert set(names) == {BEST, "best-epoch3-step3.pt", "last.pt"}
    assert torch.load(tmp_path / BEST, weights_only=True)["epoch"] == 2
    resumed = BestCheckpoints(Monitor("val/loss", "min"), top_k=2)
    resumed.load_state_dict(torch.load(tmp_path / "last.pt", weights_only=True)["best_checkpoints"])
    assert resumed.offer(0.8, 4, 4).write is None and resumed.offer(0.6, 4, 4).drop == ("best-epoch3-step3.pt",)
    # Fewer kept on resume: the best of them, the rest dropped at the next best save.
    fewer = BestCheckpoints(Monitor("val/loss", "min"), top_k=1)
    fewer.load_state_dict(torch.load(tmp_path / "last.pt", weights_only=True)["best_checkpoints"])
    assert [k.value for k in fewer.kept] == [0.5] and fewer.offer(0.4, 4, 4).drop == ("best-epoch3-step3.pt",)
    # Ranked by another figure: afresh, and the earlier ranking's files go at its first best save.
    checkpointer.best = BestCheckpoints(Monitor("val/acc"), top_k=2)
    checkpointer.best.load_state_dict(torch.load(tmp_path / "last.pt", weights_only=True)["best_checkpoints"])
    assert checkpointer.best.kept == [] and checkpointer.best.offer(0.1, 4, 4).drop == ("best-epoch3-step3.pt",)
    assert checkpointer.best.offer(0.2, 5, 5).drop == ()  # once


@pytest.mark.slow
def test_a_resume_that_ranks_by_another_figure_keeps_no_file_of_the_earlier_ranking(tmp_path):
    run_dir, tiny = (
        tmp_path / "run",
        ["debug=fdr", "scheduler=none", "trainer.epochs=3", "trainer.checkpoint.save_top_k=2"],
    )
    first = run_train(run_dir, *tiny, "trainer.max_steps=6")  # 2 epochs of 3 steps: two best files by val/acc
    assert first.returncode == 0, first.stderr
    assert len(list((run_dir / "checkpoints").glob("best-epoch*.pt"))) == 1
    resumed = run_train(run_dir, *tiny, "trainer.checkpoint.monitor=val/loss", "trainer.resume=auto")
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [BEST, "last.pt"]  # epoch 3's alone
    kept = torch.load(run_dir / "checkpoints" / BEST, weights_only=True)["best_checkpoints"]
    assert (kept["monitor"], kept["mode"], [k["epoch"] for k in kept["kept"]]) == ("val/loss", "min", [3])
    # The epoch's line says the ranked figure's best beside the best accuracy; the first run's did not.
    lines = [line for line in (run_dir / "train.log").read_text().splitlines() if " - epoch " in line]
    assert [f"best val/loss {kept['kept'][0]['value']:.4f}  " in line for line in lines] == [False, False, True]


def test_the_confusion_matrix_scores_each_class_and_the_macro_f1_by_hand():
    matrix = np.array([[3, 1, 0], [0, 2, 2], [0, 0, 0]])  # rows: true 0, 1, 2 (2 never occurs); columns: predicted
    figures = scores(matrix, ["cat", "dog", "emu"])
    f1 = [2 * 3 / (4 + 3), 2 * 2 / (4 + 3), 0.0]  # 2TP / (true + predicted); emu is predicted twice, never right
    assert figures == pytest.approx({"val/class_acc/cat": 0.75, "val/class_acc/dog": 0.5, "val/macro_f1": sum(f1) / 3})
    image = draw(matrix, ["cat", "dog", "emu"], "epoch 1")
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3


@pytest.mark.parametrize(
    "overrides, refusal",
    [
        (["trainer.checkpoint.monitor=val/acuracy"], "trainer.checkpoint.monitor=val/acuracy: this run produces no "),
        # A figure the run would produce with the EMA, or with a callback: the override that adds it
        # (the nearest name it has, val/acc, is not what was meant).
        (
            ["trainer.checkpoint.monitor=val_ema/acc"],
            "trainer.checkpoint.monitor=val_ema/acc: this run produces no such figure at validation's end; "
            "it is the EMA's figure: add trainer.ema_decay=<decay>, e.g. 0.999",
        ),
        (  # not one of the EMA's figures either
            ["trainer.checkpoint.monitor=val_ema/acx"],
            "trainer.checkpoint.monitor=val_ema/acx: this run produces no such figure at validation's end; did you mean",
        ),
        (
            ["callbacks=stop_at", "callbacks.stop_at.monitor=val/macro_f1"],
            "callbacks.stop_at.monitor=val/macro_f1: this run produces no such figure at validation's end; "
            "it is confusion_matrix's figure: add callbacks=[stop_at,confusion_matrix]",
        ),
        (
            ["trainer.checkpoint.monitor=val/balanced_acc"],
            "trainer.checkpoint.monitor=val/balanced_acc: this run produces no such figure at validation's end; "
            "it is balanced_accuracy's figure: add callbacks=balanced_accuracy",
        ),
        (
            ["callbacks=early_stopping", "callbacks.early_stopping.monitor=val/los"],
            "callbacks.early_stopping.monitor=val/los: this run produces no such figure at validation's end; "
            "did you mean val/loss? it produces val/loss, ",
        ),
        (  # max would keep the highest losses
            ["trainer.checkpoint.monitor=val/loss", "trainer.checkpoint.mode=max"],
            "trainer.checkpoint.monitor=val/loss is better lower, but trainer.checkpoint.mode=max: "
            "add trainer.checkpoint.mode=min",
        ),
        (  # min would count a fall in accuracy as progress
            [
                "callbacks=early_stopping",
                "callbacks.early_stopping.monitor=val/acc",
                "callbacks.early_stopping.mode=min",
            ],
            "callbacks.early_stopping.monitor=val/acc is better higher, but callbacks.early_stopping.mode=min: "
            "add callbacks.early_stopping.mode=max",
        ),
        (  # the default mode, auto, takes the way a figure's name says: this one's says none
            ["callbacks=grad_norm", "trainer.checkpoint.monitor=train/grad_norm"],
            "trainer.checkpoint.mode=auto: train/grad_norm's name does not say which way is better; "
            "add trainer.checkpoint.mode=max or min",
        ),
    ],
)
def test_a_monitor_the_run_does_not_produce_or_ranked_against_its_figure_is_one_line_naming_the_fix(overrides, refusal):
    with pytest.raises(ConfigError) as refused:
        check_and_plan(typed_config(*overrides))
    assert str(refused.value).startswith(refusal) and "\n" not in str(refused.value)


def test_an_option_of_conf_callbacks_that_does_not_import_is_passed_over_when_naming_a_figures_source(
    tmp_path, monkeypatch, caplog
):
    (tmp_path / "callbacks").mkdir()
    (tmp_path / "callbacks" / "a_broken.yaml").write_text("a_broken:\n  _target_: nowhere.Nothing\n")
    (tmp_path / "callbacks" / "no_target.yaml").write_text("no_target:\n  size: 2\n")
    (tmp_path / "callbacks" / "not_a_callback.yaml").write_text("not_a_callback:\n  _target_: builtins.dict\n")
    shipped = CONF_DIR / "callbacks" / "confusion_matrix.yaml"
    (tmp_path / "callbacks" / shipped.name).write_text(shipped.read_text())
    monkeypatch.setattr(preflight, "CONF_DIR", tmp_path)
    assert preflight._source_of("val/macro_f1", []) == "confusion_matrix's figure: add callbacks=confusion_matrix"
    assert preflight._source_of("val/nothing", ["stop_at"]) is None
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # passed over in silence: no Hydra ERROR


def test_a_monitor_may_name_a_callbacks_figure_the_emas_its_better_way_and_a_threshold_either_way():
    check_and_plan(typed_config("callbacks=confusion_matrix", "trainer.checkpoint.monitor=val/macro_f1"))
    check_and_plan(typed_config("trainer.ema_decay=0.9", "trainer.checkpoint.monitor=val_ema/acc"))
    check_and_plan(typed_config("trainer.checkpoint.monitor=val/loss"))  # mode=auto: min
    check_and_plan(typed_config("callbacks=early_stopping", "callbacks.early_stopping.monitor=val/acc"))  # auto: max
    check_and_plan(
        typed_config("callbacks=grad_norm", "trainer.checkpoint.monitor=train/grad_norm", "trainer.checkpoint.mode=min")
    )
    # stop_at waits for a value to be reached, either way: a loss at least that high catches a divergence.
    check_and_plan(
        typed_config("callbacks=stop_at", "callbacks.stop_at.monitor=val/loss", "callbacks.stop_at.mode=max")
    )


def test_which_way_a_figures_name_says_is_better():
    names = ["val/loss", "val_ema/ce", "time/train_s", "wall_s", "val/acc5", "val/balanced_acc", "best_val_acc"]
    names += ["val/macro_f1", "throughput/samples_per_s", "train_samples_per_s", "train/grad_norm", "peak_memory_mb"]
    assert [better_way(n) for n in names] == [*["min"] * 4, *["max"] * 6, None, None]
    # mode=auto is resolved as the monitor is made: what its best and a checkpoint's ranking read
    assert (Monitor("val/loss").mode, Monitor("val_ema/acc").mode, Monitor("val/acc", "min").mode) == (
        "min",
        "max",
        "min",
    )
    with pytest.raises(ValueError, match="mode=auto: train/grad_norm's name does not say which way is better"):
        Monitor("train/grad_norm").improves(1.0, 2.0)  # it ranks nothing (the pre-flight refuses it first)


def test_a_callbacks_option_without_its_name_names_the_key_to_give():
    with pytest.raises(
        ConfigError, match=r"^callbacks.patience: no such key; did you mean callbacks.early_stopping.patience\?$"
    ):
        check_overrides(["callbacks=early_stopping", "callbacks.patience=2"])
    # The callback that has the option, of those chosen; the chosen ones named when none has it.
    with pytest.raises(ConfigError, match=r"^callbacks.patience: .* mean callbacks.early_stopping.patience\?$"):
        check_overrides(["callbacks=[confusion_matrix,early_stopping]", "callbacks.patience=2"])
    with pytest.raises(ConfigError, match=r"^callbacks.patience.x: .* mean callbacks.early_stopping.patience.x\?$"):
        check_overrides(["callbacks=early_stopping", "callbacks.patience.x=2"])
    with pytest.raises(ConfigError) as refused:
        check_overrides(["callbacks=[confusion_matrix,early_stopping]", "callbacks.window.size=2"])
    assert str(refused.value) == (
        "callbacks.window.size: no such key; a callback's option is callbacks.<name>.window.size, and this run's "
        "callbacks are: confusion_matrix, early_stopping (choose one with callbacks=<name>, conf/callbacks/)"
    )
    with pytest.raises(ConfigError, match=r"and this run's callbacks are: none \(choose one with callbacks=<name>"):
        check_overrides(["callbacks.patience=2"])


# The built-in options end to end: early stopping that can never see an improvement (min_delta), so
# it stops after `patience` more validations, 2 best checkpoints, the confusion matrix, whose macro-F1
# both rank, though early stopping comes first in the list (it read the figure before it was added,
# a KeyError after epoch 1); 6 epochs of 3
# steps at most. A kill at epoch 3's validation end (rank 1's) leaves last.pt at epoch 2's end, with
# one validation of patience spent: a resume that forgot it would stop at epoch 5, not 3.
BUILT_INS = [
    "debug=fdr",
    "trainer.epochs=6",
    "callbacks=[early_stopping,confusion_matrix]",
    "callbacks.early_stopping.monitor=val/macro_f1",
    "callbacks.early_stopping.min_delta=100",
    "callbacks.early_stopping.patience=2",
    "callbacks.confusion_matrix.image=false",
    "trainer.checkpoint.save_top_k=2",
]
KILL = ["+callbacks.kill._target_=tests.faults.KillAt", "+callbacks.kill.epoch=2", "+callbacks.kill.rank=1"]
DDP = ["strategy=ddp", "trainer.accelerator=cpu", "trainer.devices=2"]
FSDP = ["strategy=fsdp", "trainer.accelerator=cpu", "trainer.devices=2"]


def _matrix(run_dir: Path) -> dict:
    return json.loads((run_dir / "confusion_matrix.json").read_text())


def _final_weights(run_dir: Path) -> Path:
    """The run's last.pt as a whole file: strategy=fsdp's sharded one consolidated."""
    last = run_dir / "checkpoints" / "last.pt"
    if not last.is_dir():
        return last
    train_state = sharded.describe(last)
    whole = run_dir.parent / "consolidated.pt"
    save_checkpoint({**train_state, "model": sharded.read_model_state(last), "optimizer": {}}, whole)
    return whole


@pytest.mark.slow
@pytest.mark.parametrize(
    "trained, resumed, tested_by",
    # ddp: resumed on one process, whose final matrix 2 ranks give again from its last.pt;
    # fsdp: the final matrix of 2 ranks, which one process gives again from the same weights.
    [(DDP, [], DDP), (FSDP, FSDP, [])],
    ids=["ddp-then-single", "fsdp"],
)
def test_the_built_ins_survive_kill_9_and_resume_and_the_matrix_is_exact(tmp_path, trained, resumed, tested_by):
    run_dir, chosen = tmp_path / "run", [*BUILT_INS, "trainer.checkpoint.monitor=val/macro_f1"]
    killed = run_train(run_dir, *chosen, *trained, *KILL)
    assert killed.returncode != 0
    last = run_dir / "checkpoints" / "last.pt"
    saved = sharded.describe(last) if last.is_dir() else torch.load(last, weights_only=True)
    assert saved["epoch"] == 2 and saved["callbacks"]["early_stopping"]["waited"] == 1
    result = run_train(run_dir, *chosen, *resumed, "trainer.resume=auto")
    assert result.returncode == 0, result.stderr
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["epochs"] == 3 and metrics["stopped_early"].startswith(
        "early_stopping: val/macro_f1 has not improved"
    )
    assert metrics["world_size"] == (2 if resumed else 1)
    assert "stopping early at step 9: early_stopping" in (run_dir / "train.log").read_text()
    best = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("best"))
    assert len(best) == 2 and BEST in best
    kept = torch.load(run_dir / "checkpoints" / BEST, weights_only=True)["best_checkpoints"]["kept"]
    assert kept[0]["value"] > kept[1]["value"] and kept[0]["name"] == BEST
    # The matrix of every rank's shard, summed, equals one process's on the same weights.
    test_dir = tmp_path / "tested"
    evaluated = run_train(
        test_dir,
        "debug=fdr",
        "callbacks=confusion_matrix",
        f"trainer.resume={_final_weights(run_dir)}",
        "trainer.test_only=true",
        *tested_by,
    )
    assert evaluated.returncode == 0, evaluated.stderr
    assert _matrix(test_dir)["matrix"] == _matrix(run_dir)["matrix"]
    assert json.loads((test_dir / "metrics.json").read_text())["val_macro_f1"] == metrics["val_macro_f1"]


@pytest.mark.slow
def test_a_rank_with_no_validation_sample_still_joins_the_counting_callbacks_sums(run_dir):
    """One validation sample, two ranks: the empty rank skipped the counting callbacks' all-reduce,
    which the other waited in (a SIGABRT; since a callback is held to its figures, a refusal saying
    it added none)."""
    one_sample = ["dataset=synthetic", "dataset.val_size=1", "dataset.train_size=64", "model=simple_cnn"]
    counting = ["callbacks=[confusion_matrix,balanced_accuracy]", "callbacks.confusion_matrix.image=false"]
    result = run_train(run_dir, *DDP, *one_sample, *counting, "trainer.epochs=1", "trainer.batch_size=16")
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["val_acc"] in (0, 1)  # one sample
    assert metrics["val_balanced_acc"] == metrics["val_acc"] == metrics["val_macro_f1"]

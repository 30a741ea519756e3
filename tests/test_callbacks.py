"""The loop's seams: the callbacks' events (order, arguments, what they add), the gradient norm
measured once and only when asked for, and the Logger interface, which gets what TensorBoard gets."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from data import Loaders
from distributed.context import DistContext, make_context
from errors import ConfigError
from tests.faults import Misnamed
from tests.runs import run_train
from tests.test_reporting import _tensorboard
from tests.test_train_step import CPU, TinyNet, _batch, _trainer
from training.callbacks import Callback, RunInfo, end_validation
from training.callbacks.early_stopping import EarlyStopping
from training.callbacks.grad_norm import GradNorm
from training.samples import SampleImages
from training.trainer import Reporting


def _loaders() -> Loaders:
    """3 training batches of 4 an epoch; validation, 2 batches of 4."""
    torch.manual_seed(0)
    data = TensorDataset(*_batch(12))
    sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=False)
    return Loaders(
        DataLoader(data, batch_size=4, sampler=sampler), DataLoader(TensorDataset(*_batch(8)), batch_size=4), sampler
    )


class Recorder(Callback):
    """Every event it sees, with what it was given; it adds a figure to the epoch's and the run's."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def after_backward(self, step: int, model: nn.Module, grad_norm: torch.Tensor) -> None:
        grads = [p.grad for p in model.parameters()]
        self.events.append(("after_backward", step, grad_norm.item(), nn.utils.get_total_norm(grads).item()))

    def on_validation_batch_end(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.events.append(("on_validation_batch_end", tuple(outputs.shape), targets.tolist()))

    def on_validation_end(self, epoch: int, step: int, figures: dict[str, float]) -> None:
        self.events.append(("on_validation_end", epoch, step, sorted(figures)))
        figures["mine/epoch"] = float(epoch)

    def on_train_end(self, metrics: dict[str, Any]) -> None:
        self.events.append(("on_train_end", metrics["steps"], metrics["epochs"]))
        metrics["mine"] = 1


class Scalars:
    """A Logger that keeps what it is given."""

    def __init__(self) -> None:
        self.scalars: dict[str, list[tuple[int, float]]] = {}
        self.images: list[tuple[int, str, tuple[int, ...]]] = []

    def log_scalars(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self.scalars.setdefault(tag, []).append((step, value))

    def log_image(self, step: int, tag: str, hwc) -> None:
        self.images.append((step, tag, hwc.shape))

    def log_hparams(self, hparams, metrics) -> None: ...

    def close(self) -> None: ...


def test_the_events_come_in_order_with_the_unclipped_norm_and_what_a_callback_adds_is_reported(tmp_path):
    recorder, logger = Recorder(), Scalars()
    trainer = _trainer(
        TinyNet(),
        tmp_path,
        loaders=_loaders(),
        reporting=Reporting([logger], [recorder]),
        epochs=2,
        grad_clip=1e-3,
        log_every_n_steps=2,
    )
    metrics = trainer.fit()
    names = [event[0] for event in recorder.events]
    epoch = ["after_backward"] * 3 + ["on_validation_batch_end"] * 2 + ["on_validation_end"]
    assert names == epoch + epoch + ["on_train_end"]
    # Each validation batch's logits and labels, the model's (4 a batch, 10 classes)
    batches = [event[1:] for event in recorder.events if event[0] == "on_validation_batch_end"][:2]
    assert batches == [((4, 10), labels) for labels in _loaders().val.dataset.tensors[1].view(2, 4).tolist()]
    steps = [event[1] for event in recorder.events if event[0] == "after_backward"]
    assert steps == [1, 2, 3, 4, 5, 6]
    for _, _, shared, measured in (event for event in recorder.events if event[0] == "after_backward"):
        assert shared == pytest.approx(measured) and shared > 1e-3  # before clipping to 1e-3
    (_, epoch, step, tags), *_ = (event for event in recorder.events if event[0] == "on_validation_end")
    assert (epoch, step) == (0, 3) and {"val/loss", "val/ce", "val/acc", "time/train_s"} <= set(tags)
    assert recorder.events[-1] == ("on_train_end", 6, 2) and metrics["mine"] == 1
    assert logger.scalars["mine/epoch"] == [(3, 0.0), (6, 1.0)]


class _Adds(Callback):
    figures = ("val/macro_f1",)

    def on_validation_end(self, epoch: int, step: int, figures: dict[str, float]) -> str | None:
        figures["val/macro_f1"] = 0.5
        return "added, then stopped"


def test_a_callback_may_read_a_figure_that_one_listed_after_it_adds():
    # Early stopping listed before the callback whose figure it watches read it before it was added.
    watcher = EarlyStopping(monitor="val/macro_f1", patience=1, min_delta=100)
    figures, ctx = {"val/acc": 0.1}, make_context(0, 0, 1, 1, "cpu", use_process_group=False)
    assert end_validation([watcher, _Adds()], 0, 3, figures, ctx) == "added, then stopped"
    assert (figures["val/macro_f1"], watcher.best) == (0.5, 0.5)
    reason = end_validation([watcher, _Adds()], 1, 6, figures, ctx)
    assert reason == "added, then stopped"  # the adders' reasons come first as they run first
    assert watcher.waited == 1


def test_a_figure_a_callback_names_but_adds_under_another_name_stops_at_validation_in_one_line():
    # The epoch's line, metrics.json and a monitor take the names in `figures`: one added as val/mien
    # would be missing from the first two without a word, and a KeyError in the third.
    ctx = make_context(0, 0, 1, 1, "cpu", use_process_group=False)
    with pytest.raises(ConfigError) as refused:
        end_validation([EarlyStopping(monitor="val/mine", mode="max"), Misnamed()], 0, 3, {"val/acc": 0.1}, ctx)
    assert str(refused.value).startswith(
        "tests.faults.Misnamed names val/mine in its `figures` but did not add it at epoch 1's validation "
        "(it added val/mien); add each figure it names"
    )


@pytest.mark.slow
def test_a_misnamed_figure_is_one_line_through_train_py_not_a_key_error_where_it_is_monitored(run_dir):
    monitored = ["trainer.checkpoint.monitor=val/mine", "trainer.checkpoint.mode=max"]
    result = run_train(run_dir, "debug=fdr", "+callbacks.misnamed._target_=tests.faults.Misnamed", *monitored)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: tests.faults.Misnamed names val/mine in its `figures` but did not add it at epoch 1's validation "
        "(it added val/mien); add each figure it names, under that name, at every validation's end (NaN where "
        "it has none)"
    ]
    assert not (run_dir / "checkpoints" / "last.pt").exists()


@pytest.mark.parametrize(
    "grad_clip, callbacks, norms",
    [
        (None, [], 0),  # nothing asks: the step measures nothing
        (None, [Callback()], 0),  # a callback without after_backward does not ask either
        (None, [GradNorm()], 3),
        (1.0, [GradNorm()], 3),  # clipping and the callback share one norm a step
    ],
)
def test_the_gradient_norm_is_measured_once_a_step_and_only_when_asked_for(
    tmp_path, monkeypatch, grad_clip, callbacks, norms
):
    calls = []
    measure = torch._foreach_norm  # the kernel of every gradient norm torch computes, clipping's too
    monkeypatch.setattr(torch, "_foreach_norm", lambda *args, **kwargs: calls.append(1) or measure(*args, **kwargs))
    trainer = _trainer(TinyNet(), tmp_path, loaders=_loaders(), reporting=Reporting((), callbacks), grad_clip=grad_clip)
    trainer.train_epoch()
    assert len(calls) == norms


def test_grad_norm_reports_each_epochs_mean_finite_norm_and_reads_the_device_once_an_epoch(tmp_path, monkeypatch):
    norms, logger = [], Scalars()

    class Spy(Callback):
        def after_backward(self, step: int, model: nn.Module, grad_norm: torch.Tensor) -> None:
            norms.append(grad_norm.item())

    model = TinyNet()
    _trainer(model, tmp_path, loaders=_loaders(), reporting=Reporting([logger], [Spy(), GradNorm()]), epochs=2).fit()
    means = [value for _, value in logger.scalars["train/grad_norm"]]
    assert means == pytest.approx([sum(norms[:3]) / 3, sum(norms[3:]) / 3])
    reads = []
    for name in ("item", "tolist", "__float__", "__bool__", "__int__"):
        read = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda t, *a, _r=read, _n=name: reads.append(_n) or _r(t, *a))
    callback = GradNorm()
    for step, norm in enumerate((1.0, 2.0, float("inf"), 3.0), start=1):  # an fp16 overflow: its update is skipped
        callback.after_backward(step, model, torch.tensor(norm))
    assert reads == []  # no wait for the device in the step
    figures = {}
    callback.on_validation_end(0, 3, figures)
    assert figures == {"train/grad_norm": 2.0} and len(reads) == 1
    callback.after_backward(4, model, torch.tensor(float("inf")))  # an epoch of overflows only
    callback.on_validation_end(1, 4, figures)
    assert math.isnan(figures["train/grad_norm"])


def test_a_logger_gets_the_scalars_and_images_tensorboard_gets(tmp_path):
    logger, tensorboard = Scalars(), _tensorboard(tmp_path)
    loaders = _loaders()
    model = TinyNet()
    samples = SampleImages(3, model, loaders.val, CPU)
    samples.setup(RunInfo(DistContext(0, 0, 1, 1, CPU, None), [logger, tensorboard], [], tmp_path))
    reporting = Reporting([logger, tensorboard], [samples, GradNorm()])
    trainer = _trainer(model, tmp_path, loaders=loaders, reporting=reporting, epochs=2, log_every_n_steps=2)
    trainer.fit()
    tensorboard.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == set(logger.scalars) >= {"train/loss", "lr", "val/ce", "train/grad_norm"}
    for tag, points in logger.scalars.items():
        written = events.Scalars(tag)
        assert [e.step for e in written] == [step for step, _ in points], tag
        assert [e.value for e in written] == pytest.approx([value for _, value in points], rel=1e-6), tag
    assert [(e.step, "val/samples", (e.height, e.width, 3)) for e in events.Images("val/samples")] == logger.images

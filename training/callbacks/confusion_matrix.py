"""callbacks=confusion_matrix: the validation set's confusion matrix, each class's accuracy and the
macro-F1, counted on the device and summed over the ranks: exact under DDP and FSDP (every sample
once, as validation shards without padding)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import torch

from distributed.collectives import all_reduce_sum
from training.callbacks import Callback, RunInfo


class ConfusionMatrix(Callback):
    """val/macro_f1 and val/class_acc/<class> as scalars each validation; the matrix as an image
    (rows: the true class, columns: the predicted one), labelled with the class names, to every
    logger that takes images (`image`: false leaves it out), and the last one's counts in the run
    dir, confusion_matrix.json."""

    figures = ("val/macro_f1",)

    def __init__(self, image: bool = True) -> None:
        self.image = image
        self.run: RunInfo | None = None
        self.counts: torch.Tensor | None = None  # [true, predicted], this rank's shard until reduced

    def setup(self, run: RunInfo) -> None:
        self.run = run

    def on_validation_batch_end(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        classes = outputs.shape[1]
        if self.counts is None:
            self.counts = torch.zeros(classes * classes, dtype=torch.int64, device=outputs.device)
        self.counts += torch.bincount(targets * classes + outputs.argmax(dim=1), minlength=classes * classes)

    def on_validation_end(self, epoch: int, step: int, figures: dict[str, float]) -> None:
        counts, self.counts = self.counts, None
        if self.run is None:
            return
        if counts is None:  # no validation batch on this rank (fewer samples than ranks): it still joins the sum
            classes = len(self.run.class_names)
            counts = torch.zeros(classes * classes, dtype=torch.int64, device=self.run.ctx.device)
        classes = int(round(len(counts) ** 0.5))
        matrix = all_reduce_sum(counts, self.run.ctx).view(classes, classes).cpu().numpy()
        names = _names(self.run.class_names, classes)
        figures.update(scores(matrix, names))
        if self.run.ctx.is_main:
            record = {"epoch": epoch + 1, "step": step, "classes": names, "matrix": matrix.tolist()}
            (self.run.run_dir / "confusion_matrix.json").write_text(json.dumps(record) + "\n")
        if self.image and self.run.loggers:
            hwc = draw(matrix, names, f"epoch {epoch + 1}")
            for logger in self.run.loggers:
                logger.log_image(step, "val/confusion_matrix", hwc)


def scores(matrix: np.ndarray, names: Sequence[str]) -> dict[str, float]:
    """Each class's accuracy (recall: the share of its samples predicted as it) and the macro-F1, the
    mean F1 over the classes that occur (as true or predicted labels; a class with neither has no F1)."""
    true, predicted, hits = matrix.sum(axis=1), matrix.sum(axis=0), np.diag(matrix)
    figures = {f"val/class_acc/{name}": float(hits[i] / true[i]) for i, name in enumerate(names) if true[i]}
    occurring = (true + predicted) > 0
    f1 = 2 * hits[occurring] / (true + predicted)[occurring]
    figures["val/macro_f1"] = float(f1.mean()) if len(f1) else 0.0
    return figures


def draw(matrix: np.ndarray, names: Sequence[str], title: str) -> np.ndarray:
    """The matrix as an image, uint8 H x W x 3: each row shaded by its share, the counts written in
    (up to 20 classes; a larger matrix is shaded only)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    classes = len(names)
    share = matrix / np.maximum(matrix.sum(axis=1, keepdims=True), 1)
    size = min(12.0, 2.5 + 0.45 * classes)
    figure, axes = plt.subplots(figsize=(size, size), dpi=100)
    axes.imshow(share, cmap="Blues", vmin=0, vmax=1)
    axes.set_xticks(range(classes), names, rotation=90 if classes > 10 else 0)
    axes.set_yticks(range(classes), names)
    axes.set_xlabel("predicted")
    axes.set_ylabel("true")
    axes.set_title(f"confusion matrix, {title}")
    if classes <= 20:
        for (row, column), count in np.ndenumerate(matrix):
            color = "white" if share[row, column] > 0.5 else "black"
            axes.text(column, row, str(count), ha="center", va="center", color=color, fontsize=8)
    figure.tight_layout()
    figure.canvas.draw()
    hwc = np.asarray(figure.canvas.buffer_rgba())[..., :3].copy()
    plt.close(figure)
    return hwc


def _names(given: Sequence[str], classes: int) -> list[str]:
    return list(given) if len(given) == classes else [str(i) for i in range(classes)]

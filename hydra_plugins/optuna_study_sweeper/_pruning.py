"""hydra.sweeper.pruner: a trial that Optuna's pruner finds hopeless stops at an epoch's end.

Each trial of a pruned search runs this callback, which the sweeper adds to the trial's config
(callbacks.optuna_pruning): at each validation's end rank 0 reports the monitored figure to the
trial in the study and asks the pruner, which compares it with the other trials' at that epoch; on
"prune" it marks the trial (user attribute `pruned`, its reason) and returns the reason, so every
rank stops at this epoch's end and the run ends normally, saying why. The sweeper then records the
trial as PRUNED, its value the last figure reported. The pruner reads the study, so a trial must
reach its storage: the sweep dir's SQLite on this machine, a journal on a shared filesystem, or a
database server.
"""

from __future__ import annotations

import logging
import warnings
from typing import TYPE_CHECKING, Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.pruners import BasePruner, HyperbandPruner, MedianPruner, NopPruner, SuccessiveHalvingPruner

from errors import first_line
from hydra_plugins.optuna_study_sweeper import _optuna_private, _storage
from training.callbacks import Callback

if TYPE_CHECKING:
    from training.callbacks import RunInfo  # issue #39's: what setup() gives a callback of its run

log = logging.getLogger("train")

# Optuna's pruners, with Optuna's defaults: median waits for 5 complete trials, then stops a trial
# whose figure at an epoch is worse than the median of the others' at that epoch; successive halving
# and hyperband keep the best 1/4 (1/3) of the trials at each rung of epochs.
PRUNERS: dict[str, type[BasePruner]] = {
    "none": NopPruner,
    "median": MedianPruner,
    "successive_halving": SuccessiveHalvingPruner,
    "hyperband": HyperbandPruner,
}
PRUNED = "pruned"  # the trial's user attribute that says so, with the reason


def epoch_figure(metric: str) -> str | None:
    """The figure validation reports each epoch that ends as `metric` in metrics.json (best_val_acc:
    val/best_acc, val_loss: val/loss, val_ema_acc: val_ema/acc); None for one it has not (wall_s).
    test_pruning holds these to the figures the Trainer makes (training.validation.produced)."""
    if metric.startswith("best_val_"):
        return f"val/best_{metric.removeprefix('best_val_')}"
    for group in ("val_ema", "val"):
        if metric.startswith(f"{group}_"):
            return f"{group}/{metric.removeprefix(f'{group}_')}"
    return None


class OptunaPruning(Callback):
    """Reports `metric`'s figure each epoch to trial `trial` of study `study_name` in `storage`, and
    stops the run when `pruner` says so. Built on every rank (and once before launch: nothing here
    opens the storage until the first report)."""

    def __init__(self, storage: str, study_name: str, trial: int, pruner: str, metric: str) -> None:
        if pruner not in PRUNERS:
            raise ValueError(f"no pruner {pruner}: choose {', '.join(PRUNERS)}")
        monitor = epoch_figure(metric)
        if monitor is None:
            raise ValueError(f"{metric} has no figure each epoch to report; prune on val_loss or an accuracy")
        self.storage, self.study_name, self.number, self.pruner = storage, study_name, trial, pruner
        # The figure it reports, named `monitor` for the pre-flight, which checks that the run makes it.
        self.monitor = monitor
        self._trial: optuna.Trial | None = None
        self._main = True  # rank 0, or the run's only process, until setup() says otherwise

    def setup(self, run: RunInfo) -> None:
        self._main = run.ctx.is_main  # rank 0 alone talks to the study

    def on_validation_end(self, epoch: int, step: int, figures: dict[str, float]) -> str | None:
        """Rank 0 reports epoch `epoch`'s figure and asks the pruner; its reason to stop, or None."""
        if not self._main:
            return None
        value = figures[self.monitor]
        try:
            trial = self._trial or self._open()
            trial.report(value, epoch)
            if not trial.should_prune():
                return None
            reason = f"pruned by Optuna's {self.pruner} pruner at epoch {epoch + 1}: {self.monitor} {value:.4g}"
            trial.set_user_attr(PRUNED, reason)
            return reason
        except UpdateFinishedTrialError:  # a sweeper of the study failed it as stale, and runs it again
            ended = f"trial {self.number} of study {self.study_name} was ended by its search"
            return f"{ended} (its sweeper missed heartbeats)"
        except Exception as e:  # the storage out of reach for a while: the trial goes on, unpruned
            log.warning(
                "could not report to study %s: %s; trial %d goes on", self.study_name, first_line(e), self.number
            )
            return None

    def _open(self) -> optuna.Trial:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeats' storage
            study = optuna.load_study(
                study_name=self.study_name,
                storage=_storage.open_storage(self.storage, heartbeat_interval=None, grace_period=None),
                sampler=optuna.samplers.RandomSampler(),  # a Trial's start asks it: no TPE fitted for nothing
                pruner=PRUNERS[self.pruner](),
            )
        self._trial = optuna.Trial(study, _optuna_private.trial_id(study.get_trials(deepcopy=False)[self.number]))
        return self._trial

    def state_dict(self) -> dict[str, Any]:
        return {}  # the study holds what was reported; a resumed trial reports its epochs again

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

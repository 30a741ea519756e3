"""The Sweeper Hydra instantiates. Hydra's plugin scan imports this module at every start of
train.py, so Optuna is imported only when a sweep runs (in _study.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class ExitIsFailure:
    """train.py ends a failed job (a diverged loss, a config error) with sys.exit(1 or 2), which
    Hydra's run_job, catching Exception only, would let out of the whole search: it becomes the
    trial's failure instead, for max_failure_rate to judge. 128 + a signal (a preempted job) and a
    clean exit still end the search."""

    def __init__(self, task_function: TaskFunction) -> None:
        self.task_function = task_function

    def __call__(self, cfg: DictConfig) -> Any:
        try:
            return self.task_function(cfg)
        except SystemExit as e:
            if isinstance(e.code, int) and 0 < e.code < 128:
                raise RuntimeError(f"the job exited with status {e.code}") from None
            raise


class OptunaStudySweeper(Sweeper):
    def __init__(
        self,
        metric: str,
        direction: str,
        study_name: str,
        storage: str | None,
        n_trials: int,
        n_jobs: int,
        max_failure_rate: float,
        heartbeat_interval: int,
        grace_period: int | None,
        pruner: str,
        sampler: DictConfig,
        params: DictConfig | None,
    ) -> None:
        self.metric = metric
        self.direction = direction
        self.study_name = study_name
        self.storage = storage
        self.n_trials = n_trials
        self.n_jobs = n_jobs
        self.max_failure_rate = max_failure_rate
        self.heartbeat_interval = heartbeat_interval
        self.grace_period = grace_period
        self.pruner = pruner
        self.sampler = sampler
        self.params = {str(k): str(v) for k, v in (params or {}).items()}
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.launcher: Launcher | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=ExitIsFailure(task_function), config=config
        )

    def sweep(self, arguments: list[str]) -> Any:
        from hydra_plugins.optuna_study_sweeper import _study

        assert self.config is not None and self.launcher is not None
        return _study.sweep(self, arguments, Path(self.config.hydra.sweep.dir))

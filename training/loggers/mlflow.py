"""logger=mlflow: an MLflow run per job, named by its overrides; a sweep's jobs share one experiment.

The store is logger.mlflow.tracking_uri (a server, Databricks, a database), else $MLFLOW_TRACKING_URI,
else SQLite: mlflow.db in the sweep's dir, or a single run's own dir, with the runs' artifacts (the
config, images, final_metrics.json) in mlartifacts/ beside it. MLflow 3 refuses its older file store.
Browse it with `mlflow ui --backend-store-uri sqlite:///<dir>/mlflow.db` (the full `mlflow` package).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from config.schema import LoggerConfig, MlflowConfig, RunConfig
from training.loggers.background import Background
from training.loggers.naming import keep_id, kept_id, run_name, sweep_name
from training.loggers.packages import import_for

PARAMS_PER_BATCH = 100  # the most params MLflow's log_batch takes at once (a run's record has about as many)


class MlflowLogger:
    takes_images = True

    def __init__(self, cfg: LoggerConfig, job: RunConfig) -> None:
        self.client: Any = None
        self.run_id = ""
        self._params: dict[str, str] = {}  # logged already
        self._logged_through: dict[str, int] = {}  # each metric's last step in the store before this process
        # MLflow's import, and a new SQLite store's schema migrations (seconds), off the critical path.
        self._opening: Background[None] | None = Background(lambda: self._open(cfg.mlflow, job), "mlflow")

    def _open(self, options: MlflowConfig, job: RunConfig) -> None:
        """This job's run started (a resumed job's, started again), its options and config logged."""
        import_for("mlflow")
        from mlflow.tracking import MlflowClient

        uri = options.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        store = (job.sweep_dir or job.run_dir).resolve()
        self.client = MlflowClient(tracking_uri=uri or f"sqlite:///{store / 'mlflow.db'}")
        kept = job.run_dir / "mlflow_run_id"
        resumed = _running_again(self.client, kept_id(kept))
        if resumed is not None:
            self.run_id, self._params = resumed.info.run_id, dict(resumed.data.params)
            self._logged_through = {
                key: max(point.step for point in self.client.get_metric_history(self.run_id, key))
                for key in resumed.data.metrics
            }
        else:
            # A fresh SQLite store's default artifact root is ./mlruns wherever train.py was started.
            artifacts = None if uri else (store / "mlartifacts").as_uri()
            experiment = _experiment_id(self.client, options.experiment or sweep_name(job) or "runs", artifacts)
            tags = {"run_dir": str(job.run_dir), **({"sweep": sweep_name(job)} if job.sweep_dir else {})}
            run = self.client.create_run(experiment, run_name=run_name(job), tags=tags)
            self.run_id = keep_id(kept, run.info.run_id)
        self._log_params(job.hparams)
        self.client.log_text(self.run_id, job.config_yaml, "config.yaml")

    def _opened(self) -> Any:
        """The client, once the run is open (the first call waits for it)."""
        if self._opening is not None:
            opening, self._opening = self._opening, None
            opening.result()
        return self.client

    def log_scalars(self, step: int, values: Mapping[str, float]) -> None:
        client = self._opened()
        client.log_batch(self.run_id, metrics=self._new_points(step, values))

    def log_image(self, step: int, tag: str, hwc: np.ndarray) -> None:
        self._opened().log_image(self.run_id, hwc, key=tag, step=step)

    def log_hparams(self, hparams: Mapping[str, Any], metrics: Mapping[str, Any]) -> None:
        """The options as params, the final figures that are numbers as metrics at the last step,
        and every figure of metrics.json (final_metrics.json) beside the run's config."""
        client = self._opened()
        self._log_params(hparams)
        numbers = {
            key: value
            for key, value in metrics.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        }
        client.log_batch(self.run_id, metrics=self._new_points(int(metrics.get("steps") or 0), numbers))
        # Not named metrics.json: bench.report takes each metrics.json under a sweep's dir for a job's.
        client.log_dict(self.run_id, dict(metrics), "final_metrics.json")

    def close(self) -> None:
        self._opened()
        if self.run_id:  # not if its start failed (raised at its first use)
            self.client.set_terminated(self.run_id)

    def _new_points(self, step: int, values: Mapping[str, float]) -> list[Any]:
        """The values as MLflow's points at `step`, less those of a step this run's store holds already.
        A resumed run trains again the steps its stopped process logged after the checkpoint. TensorBoard
        (purge_step) and the CSV drop the old points; MLflow cannot delete one (mlflow#2973), so the first
        point of each step stays: the same value when the run is deterministic."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        return [
            Metric(tag, float(value), now, step)
            for tag, value in values.items()
            if step > self._logged_through.get(tag, -1)
        ]

    def _log_params(self, hparams: Mapping[str, Any]) -> None:
        """Params not logged yet: MLflow refuses a param logged again with another value."""
        from mlflow.entities import Param

        new = [
            Param(key, str(value)) for key, value in hparams.items() if value is not None and key not in self._params
        ]
        for start in range(0, len(new), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=new[start : start + PARAMS_PER_BATCH])
        self._params.update((param.key, param.value) for param in new)


def _experiment_id(client: Any, name: str, artifact_location: str | None) -> str:
    """The experiment of this name, made if it is not there yet (by this job, or by a sweep's job
    started beside it: MLflow then refuses the second create)."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location)
    except MlflowException:
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def _running_again(client: Any, run_id: str | None) -> Any:
    """The run an earlier process of this job kept, set running again; None where this store has no
    such run (logger.mlflow.tracking_uri changed, or the run was deleted)."""
    from mlflow.exceptions import MlflowException

    if run_id is None:
        return None
    try:
        client.update_run(run_id, status="RUNNING")
        return client.get_run(run_id)
    except MlflowException:
        return None

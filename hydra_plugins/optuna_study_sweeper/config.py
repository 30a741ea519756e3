"""The sweeper's options: hydra.sweeper.* once `hydra/sweeper=optuna_study` is chosen."""

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from hydra.core.config_store import ConfigStore


@dataclass
class OptunaStudySweeperConf:
    _target_: str = "hydra_plugins.optuna_study_sweeper.optuna_study_sweeper.OptunaStudySweeper"
    _recursive_: bool = False  # the sampler is built per run, seeded by how far the study got
    # What the task function returns, named in the log and optimization_results.yaml.
    metric: str = "value"
    direction: str = "maximize"  # maximize | minimize
    # The study's name is its identity in the storage: the same name, the same study.
    study_name: str = "${hydra.job.name}"
    # sqlite:///PATH (no set-up; one writer at a time), journal:///PATH (a file that sweepers and trials
    # on a shared filesystem write at once, no server), or any SQLAlchemy URL, e.g.
    # postgresql+psycopg://USER@HOST:PORT/DB (scripts/postgres.sh), its password in PGPASSWORD or
    # ~/.pgpass, never in the URL; null: in memory, gone with the process.
    storage: Optional[str] = "sqlite:///${hydra.sweep.dir}/optuna.db"
    n_trials: int = 20  # finished trials in the study (complete or pruned), counting those of earlier runs
    # Trials at once: on this machine each in a process of its own, on its share of the CPUs and GPUs
    # (_processes.py); with hydra/launcher=submitit_slurm, as many SLURM jobs.
    n_jobs: int = 1
    max_failure_rate: float = 0.0  # failed trials in a batch, as a share, before the sweep stops
    # The sweeper beats for its running trials; one silent for grace_period (null: 2 x interval)
    # was left by a killed sweep and is run again with the same parameters.
    heartbeat_interval: int = 10
    grace_period: Optional[int] = None
    # Stop a hopeless trial at an epoch's end (_pruning.py): median | hyperband | successive_halving |
    # none, Optuna's pruners. Each trial reports optimized_metric's figure each epoch to the study.
    pruner: str = "none"
    sampler: Any = field(
        default_factory=lambda: {"_target_": "optuna.samplers.TPESampler", "seed": None, "constant_liar": True}
    )
    # key: a Hydra sweep: interval(a, b), tag(log, interval(a, b)), choice(...), range(a, b[, step])
    params: Optional[Dict[str, str]] = None


ConfigStore.instance().store(
    group="hydra/sweeper", name="optuna_study", node=OptunaStudySweeperConf, provider="optuna_study_sweeper"
)

"""Train an image classifier: python train.py [group=option ...] [key=value ...].

Hydra composes the config; the pre-flight (preflight.py) checks it against this machine before
any process starts and plans the launch; the launcher runs training.run's worker once per device
with the typed RunConfig.
"""

from __future__ import annotations

import gc

# What the imports below make (torch, Hydra, the project) lives as long as the process, yet Python
# would walk it all in a full collection each time it grew by a quarter. Off while importing, then
# frozen out of every later collection (what that saves: BENCHMARKS.md, "The start-up's full
# collections"). The few cycles the imports leave behind stay.
gc.disable()

import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from config import setup
from config.callbacks import restore_run_record
from config.hparams import hparams, varied_hparams
from config.overrides import check_overrides, command_overrides, swept_overrides
from config.typed import Composition, check_sweep, run_config, typed
from distributed.launch import end_process, launch, skip_collection_at_exit
from errors import ConfigError, NonFiniteLoss, Preempted, RankFailed
from preflight import check_and_plan, model_figures
from training.compile_cache import use_compile_cache
from training.preemption import recorded_sweep_resume_command, requeue_or_explain, resume_command
from training.run import run

gc.freeze()
gc.enable()
setup.register()
setup.mode_from_the_command_line()
log = logging.getLogger("train")
# The job this process runs, noted as it starts: Hydra's code before, between and after jobs is no
# run's, and a Ctrl-C there finds here what continues it (_resume_command's arguments).
_job: dict[str, Any] = {}


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    hydra_cfg = HydraConfig.get()
    run_dir, overrides = Path(hydra_cfg.runtime.output_dir), list(hydra_cfg.overrides.task)
    swept = swept_overrides(overrides, hydra_cfg.job.config.override_dirname.exclude_keys)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    sweep_dir = Path(hydra_cfg.sweep.dir) if multirun else None
    choices = dict(hydra_cfg.runtime.choices)
    search = choices.get("hydra/sweeper") == "optuna_study"
    _job.update(overrides=command_overrides(hydra_cfg.overrides), run_dir=run_dir, sweep_dir=sweep_dir, search=search)
    try:
        config = typed(cfg)
        if multirun:
            check_sweep(sweep_dir / "multirun.yaml")
        if config.trainer.compile:  # inductor reads it as it compiles, here or in the ranks started here
            use_compile_cache(sweep_dir or run_dir)
        plan = check_and_plan(config, run_dir, multirun=multirun)
        composition = Composition(
            run_dir=run_dir,
            choices=choices,
            swept=swept,
            hparams=hparams(cfg, choices),
            sweep_dir=sweep_dir,
            # The keys its sweep's jobs differ in, their model summaries included, for the HParams tab.
            varied=varied_hparams(sweep_dir / "multirun.yaml", model_figures) if multirun else {},
        )
        launch(plan.launch, run, run_config(config, composition, num_classes=plan.num_classes, resume=plan.resume))
    except ConfigError as e:
        restore_run_record()
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except (RankFailed, NonFiniteLoss) as e:
        if getattr(e, "traceback", None):  # where the rank's own code raised: the one line cannot say
            log.error("rank %d raised:\n%s", e.rank, e.traceback)
        log.error("%s", e)
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except Preempted as e:
        requeue_or_explain(e, list(plan.launch.requeue_signals), _resume_command(**_job))
        sys.exit(e.exit_code)
    except KeyboardInterrupt:  # Ctrl-C before the launch (a rank's is Preempted): no rank ran, the dir's record stays
        restore_run_record()
        stopped = Preempted(signal.SIGINT, saved=False)
        requeue_or_explain(stopped, [], _resume_command(**_job))
        sys.exit(stopped.exit_code)
    # A sweeper (hydra/sweeper, hparams_search) optimises what the task function returns.
    metrics = run_dir / "metrics.json"  # rank 0's; other torchrun/SLURM ranks return None
    return json.loads(metrics.read_text()).get(config.optimized_metric) if metrics.exists() else None


def _resume_command(overrides: list[str], run_dir: Path, sweep_dir: Path | None, search: bool) -> str:
    """What continues a stopped run: the run itself, or the whole sweep (or search) of a sweep's job."""
    if sweep_dir is None:
        return resume_command(overrides, str(run_dir))
    return recorded_sweep_resume_command(sweep_dir, search)


def _interrupted_outside_a_run() -> int:
    """Ctrl-C in Hydra's own code, as it starts, between a -m sweep's jobs or after the last: one
    line, with the command that continues the run or the whole sweep (a job that ended says so), and
    130, as a stopped run exits."""
    stopped = Preempted(signal.SIGINT, saved=False)
    if _job:
        print(f"{stopped} outside the run, in Hydra's code; continue with: {_resume_command(**_job)}", file=sys.stderr)
    else:
        print(f"{stopped} before a run started", file=sys.stderr)
    return stopped.exit_code


if __name__ == "__main__":
    # torch.distributed.launch (seed 001's command) hands each rank --local-rank=N, which Hydra would
    # refuse as an override: the rank reads LOCAL_RANK from its environment, as under torchrun.
    sys.argv = [arg for arg in sys.argv if not arg.startswith(("--local-rank=", "--local_rank="))]
    try:
        check_overrides(sys.argv[1:])
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    try:
        main()
    except SystemExit as e:  # a refusal, a failed or preempted run: the code it chose
        end_process(e.code)
    except KeyboardInterrupt:  # in Hydra's own code, which no run's handler covers
        end_process(_interrupted_outside_a_run())
    except BaseException:  # the interpreter prints the traceback as it exits
        skip_collection_at_exit()
        raise
    end_process(0)

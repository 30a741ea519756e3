"""Which launcher started this process, the run dir's name and whether this process writes the
run's record: read from torchrun's or SLURM's environment before Hydra composes (config.setup's
resolvers), so they live here, at the bottom, where distributed/ reads them too. Pure functions of
an env mapping."""

from __future__ import annotations

from collections.abc import Mapping

from errors import ConfigError

TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE")


def detect(env: Mapping[str, str]) -> str:
    """launcher=auto: torchrun's workers (also under `srun torchrun`), else SLURM's tasks inside
    `srun -n>1` (even with a RANK exported by a seed-002-style script), else RANK/WORLD_SIZE set
    by hand, else spawn."""
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchrun"
    # SLURM_STEP_ID: inside srun; the batch script itself has SLURM_NTASKS but is not a rank.
    if "SLURM_STEP_ID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
        return "slurm"
    if any(var in env for var in TORCHRUN_VARS):
        return "torchrun"
    return "spawn"


def run_name(launcher: str, env: Mapping[str, str], default: str) -> str:
    """The run dir's name. torchrun/srun start train.py once per rank and Hydra names the dir in
    each process, so under them it comes from the job, not from each process's clock."""
    found = detect(env) if launcher == "auto" else launcher
    if found == "torchrun":
        return _torchrun_run_name(env, default)
    if found == "slurm" and "SLURM_JOB_ID" in env:
        return _slurm_run_name(env)
    return default


def _torchrun_run_name(env: Mapping[str, str], default: str) -> str:
    run_id = env.get("TORCHELASTIC_RUN_ID")
    # torchrun's --rdzv-id defaults to "none" and is made a uuid only by --standalone (or on one
    # node given neither an endpoint nor --master-port): torch/distributed/run.py, run().
    if run_id is not None and run_id != "none":
        return f"torchrun-{run_id}"
    if "SLURM_STEP_ID" in env and "SLURM_JOB_ID" in env:
        return _slurm_run_name(env)  # srun torchrun, or ranks srun started: one step, one run
    if run_id == "none":
        raise ConfigError(
            "TORCHELASTIC_RUN_ID=none: torchrun got no --rdzv-id, so every such run would share one run dir; "
            "start torchrun with --standalone (one node) or --rdzv-id=<a name for this run>, "
            "or set hydra.run.dir=<a dir for this run>"
        )
    if int(env.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError(
            f"WORLD_SIZE={env['WORLD_SIZE']} set by hand (not by torchrun): each process would name its run dir "
            "by its own clock and the ranks could split over two dirs; set hydra.run.dir=<one dir for all ranks>"
        )
    return default


def _slurm_run_name(env: Mapping[str, str]) -> str:
    return f"slurm-{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '0')}"


def is_rank_zero(launcher: str, env: Mapping[str, str]) -> bool:
    """Before any parsing: is this the process that writes the run dir's .hydra/?"""
    found = detect(env) if launcher == "auto" else launcher
    var = {"torchrun": "RANK", "slurm": "SLURM_PROCID"}.get(found)
    return var is None or env.get(var, "0") == "0"

"""manifest.json: what a run was made of, written into its run dir by rank 0 as it starts, and carried
in every checkpoint it saves (under "manifest"): the code (the commit, whether the tree was dirty,
its diff beside it in manifest.diff), the command line and the overrides, the versions, the hosts
and devices, the world, the batch, the learning rate trained with, and the class names. A password
or key in the command line or the diff is hidden (config.redact). A resumed run writes its own when
it starts again; each checkpoint keeps the manifest of the attempt that saved it."""

from __future__ import annotations

import json
import platform
import shlex
import socket
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
import yaml

from config.redact import redact, redacted
from config.schema import RunConfig
from data import class_names
from distributed.collectives import all_gather_object
from distributed.context import DistContext

MANIFEST = "manifest.json"
DIFF = "manifest.diff"
_CODE = Path(__file__).resolve().parents[1]  # the checkout whose code runs
_UNTRACKED_LISTED = 50  # names of new files kept in the record; the rest counted


def start(ctx: DistContext, job: RunConfig) -> dict[str, Any]:
    """The run's manifest, on every rank (each tells its host and device); rank 0 writes it."""
    ranks = all_gather_object({"host": socket.gethostname(), "device": _device(ctx)}, ctx)
    if not ctx.is_main:
        return {}
    manifest, diff = record(job, ranks)
    write(job.run_dir, manifest, diff)
    return manifest


def record(job: RunConfig, ranks: list[dict[str, str]]) -> tuple[dict[str, Any], str]:
    """The manifest of `job` with `ranks` (a host and a device each), and the working tree's diff."""
    world = len(ranks)
    lr = job.optimizer.keywords.get("lr") if hasattr(job.optimizer, "keywords") else None
    code, diff = git_state(_CODE)
    manifest = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        **code,
        "command": redact(shlex.join(sys.argv)),
        "overrides": redacted(_overrides(job)),
        **versions(),
        "hosts": list(dict.fromkeys(rank["host"] for rank in ranks)),
        "ranks": ranks,
        "world_size": world,
        **job.choices,  # model, dataset, strategy: the options chosen
        "global_batch": job.trainer.batch_size,
        "batch_per_rank": job.trainer.batch_size // world,
        "accumulate_grad_batches": job.trainer.accumulate_grad_batches,
        "lr": lr,  # after optimizer.lr_scaling
        "lr_scaling": job.optimizer_options.lr_scaling.name,
        "class_names": class_names(job.dataset),
    }
    return manifest, diff


def git_state(checkout: Path) -> tuple[dict[str, Any], str]:
    """({commit, dirty, diff, untracked}, the diff against the commit): None where `checkout` is no
    git working tree (an unpacked archive) or git is missing. Dirty: a tracked file changed, or a
    file git does not ignore is not tracked (its name is listed; the diff holds tracked changes)."""
    commit = _git(checkout, "rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None, "diff": None, "untracked": []}, ""
    # Redacted as the command line is: an edited job script or config can hold a key (export
    # WANDB_API_KEY=...) that would otherwise lie in the run dir; a hidden line no longer applies.
    diff = redact(_git(checkout, "diff", "HEAD", strip=False) or "")
    untracked = (_git(checkout, "ls-files", "--others", "--exclude-standard") or "").splitlines()
    listed = untracked[:_UNTRACKED_LISTED] + (
        [f"... {len(untracked) - _UNTRACKED_LISTED} more"] if len(untracked) > _UNTRACKED_LISTED else []
    )
    state = {"commit": commit, "dirty": bool(diff or untracked), "diff": DIFF if diff else None, "untracked": listed}
    return state, diff


def _git(checkout: Path, *args: str, strip: bool = True) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() if strip else done.stdout


def versions() -> dict[str, str | None]:
    """Python's and the packages' versions; CUDA's, cuDNN's and NCCL's as this torch was built with them
    (None where it was built without)."""
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    try:
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    except (AttributeError, RuntimeError):  # a build without NCCL
        nccl = None
    return {
        "python": platform.python_version(),
        "torch": str(torch.__version__),  # a str, not torch's TorchVersion: checkpoints load with weights_only
        "cuda": torch.version.cuda,
        "cudnn": str(cudnn) if cudnn is not None else None,
        "nccl": nccl,
        "torchvision": _package("torchvision"),
        "hydra": _package("hydra-core"),
    }


def _package(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _device(ctx: DistContext) -> str:
    if ctx.device.type != "cuda":
        return str(ctx.device)
    return ", ".join(f"{device} ({torch.cuda.get_device_name(device)})" for device in ctx.devices)


def _overrides(job: RunConfig) -> list[str]:
    """The job's overrides as Hydra recorded them (.hydra/overrides.yaml: a sweep job's own values),
    else those the run's name is made of."""
    recorded = job.run_dir / ".hydra" / "overrides.yaml"
    if recorded.is_file():
        return [str(line) for line in yaml.safe_load(recorded.read_text()) or []]
    return [f"{key}={value}" for key, value in job.swept.items()]


def write(run_dir: Path, manifest: dict[str, Any], diff: str) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    if diff:
        (run_dir / DIFF).write_text(diff)
    else:
        (run_dir / DIFF).unlink(missing_ok=True)  # an earlier attempt's, from another tree


def read_manifest(run_dir: Path) -> dict[str, Any] | None:
    """A run dir's manifest.json; None where it has none (a run from before manifests) or it is not JSON."""
    try:
        manifest = json.loads((Path(run_dir) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None

"""`python train.py ...` for the tests, minus the interpreter's start-up.

Each run is still its own process running train.py as `__main__` with the given arguments, working
directory and environment, exiting with train.py's code. It is forked from a server process
(multiprocessing's forkserver) that imported, once per test worker, what every run imports
(torch, `torch._dynamo` for the first optimizer step, Hydra, torchvision, TensorBoard and this
project): most of a tiny run's CPU, and most of the suite's when every run paid it (BENCHMARKS.md,
the test suite). The server only
imports (one thread, no OpenMP pool, no CUDA), so forking it is safe; random reseeds itself in
each child (os.register_at_fork).

What this cannot show, a cold interpreter's imports, the tests that start `sys.executable
train.py` themselves still do: the default job, the ranks torchrun's agent (forked from here) and
SLURM start, and the benchmarks that time whole processes (start-up, peers, time to accuracy).
"""

from __future__ import annotations

import gc

# As train.py does: the collector off while the preload imports, then all of it frozen, in the server
# and so in every run it forks, out of their full collections.
gc.disable()

import atexit
import importlib
import multiprocessing
import multiprocessing.forkserver
import os
import pkgutil
import runpy
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

# Preloaded: what a run imports, so that its child does not (train.py's own imports, the first
# optimizer step's torch._dynamo, and a search's sweeper with Optuna and SQLAlchemy: searches run
# forked too). train.py itself runs fresh in each child.
import hydra  # noqa: F401
import torch._dynamo  # noqa: F401
import torch.utils.tensorboard  # noqa: F401
import torchvision  # noqa: F401
from hydra.core.plugins import Plugins

import config
import data
import distributed
import hydra_plugins.optuna_study_sweeper._study  # noqa: F401
import models
import train  # noqa: F401
import training
from config.setup import ROOT, compose

# train.py's imports and set-up (its resolvers, the mode read from the command line); every module of
# the project, each of which some run imports as it goes (its dataset's, its model's, the sharded
# checkpoint's); and Hydra's scan of its plugins (it imports each public module under hydra_plugins/,
# submitit's launcher among them), which each run's hydra.main would start with: done once, here. A
# composition too, for the grammars Hydra and OmegaConf parse overrides and interpolations with,
# which build their tables as they first parse.
for package in (config, data, distributed, models, training):
    for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
        importlib.import_module(module.name)
Plugins.instance()
compose("model=simple_cnn", "trainer.epochs=2", hydra=True)
gc.freeze()
gc.enable()

TRAIN_PY = ROOT / "train.py"
_context = multiprocessing.get_context("forkserver")


def ensure_running() -> None:
    """Start this process's forkserver with this module preloaded, if it is not running yet. A test
    that starts ranks here with start_method="forkserver" calls it first: the ranks then fork from
    this server, and its preload is this module's, not the first launch's (one server per process)."""
    _context.set_forkserver_preload([__name__])
    multiprocessing.forkserver.ensure_running()


def run(
    args: list[str], cwd: Path = ROOT, timeout: float = 240, script: Path = TRAIN_PY, module: str | None = None
) -> subprocess.CompletedProcess:
    """What `subprocess.run([sys.executable, "train.py", *args], cwd=cwd, capture_output=True,
    text=True, timeout=timeout)` returns; `script`: another of the repo's CLIs (predict.py, export.py,
    download.py); `module`: `python -m module *args` instead (bench.report, pytest)."""
    name = module or script.name
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        child = _start(args, cwd, out, err, new_session=False, script=script, module=module)
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired([name, *args], timeout, out.read_text(), err.read_text())
        return subprocess.CompletedProcess([name, *args], child.exitcode, out.read_text(), err.read_text())


class Started:
    """What start() started (train.py, or the module it ran): the part of subprocess.Popen the tests
    use, and the file its output goes to."""

    def __init__(self, process: multiprocessing.Process, output: Path) -> None:
        self._process, self.pid, self.output = process, process.pid, output

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired("train.py", timeout)
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start(
    args: list[str],
    output: Path,
    cwd: Path = ROOT,
    ignored: tuple[int, ...] = (),
    module: str | None = None,
    env: dict[str, str] | None = None,
) -> Started:
    """`python train.py *args` in the background, stdout and stderr to `output`, leading a session
    of its own (as `subprocess.Popen(..., start_new_session=True)`): every process it starts is in it.
    `ignored`: signals it starts with ignored, as a script's `python train.py ... &` starts with
    SIGINT ignored, and `nohup python train.py` with SIGHUP; `module`: `python -m module *args`
    instead (torchrun's agent); `env`: its environment, this process's by default."""
    return Started(_start(args, cwd, output, output, new_session=True, module=module, ignored=ignored, env=env), output)


def _start(
    args: list[str],
    cwd: Path,
    out: Path,
    err: Path,
    new_session: bool,
    script: Path = TRAIN_PY,
    module: str | None = None,
    ignored: tuple[int, ...] = (),
    env: dict[str, str] | None = None,
) -> multiprocessing.Process:
    ensure_running()
    environment = dict(os.environ) if env is None else env
    child = _context.Process(
        target=_train_py, args=(args, cwd, environment, out, err, new_session, script, module, ignored)
    )
    child.start()
    return child


def _train_py(
    args: list[str],
    cwd: Path,
    env: dict[str, str],
    out: Path,
    err: Path,
    new_session: bool,
    script: Path = TRAIN_PY,
    module: str | None = None,
    ignored: tuple[int, ...] = (),
) -> None:
    """The child: what the interpreter does for `python train.py *args` (or `script`, or `python -m
    module`), from the preloaded state."""
    if new_session:
        os.setsid()
    # As a terminal's foreground starts it, Ctrl-C raising KeyboardInterrupt and SIGHUP ending it,
    # whatever the test runner's own start passed on to the server (a runner started by a script's
    # `... &` ignores SIGINT, one under nohup SIGHUP); an interpreter started with one ignored keeps it so.
    signal.signal(signal.SIGINT, signal.SIG_IGN if signal.SIGINT in ignored else signal.default_int_handler)
    signal.signal(signal.SIGHUP, signal.SIG_IGN if signal.SIGHUP in ignored else signal.SIG_DFL)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # the temp dir its environment's TMPDIR names, not the one the server found first
    os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
    os.dup2(1 if err == out else os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    sys.argv = [module or str(script), *args]  # runpy puts the module's file in argv[0], as -m does
    # What the interpreter puts first on the path: the working directory for -m, else the script's.
    sys.path.insert(0, str(cwd if module else script.parent))
    code = 0
    try:
        if module:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:  # sys.exit(): an int is the status; anything else is printed, status 1
        if isinstance(e.code, int) or e.code is None:
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:  # as the interpreter: the traceback on stderr, exit status 1
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()  # a multiprocessing child skips them; the interpreter would run them
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

"""Start one worker per device: in this process, with torch.multiprocessing.spawn, or as one
rank of a world that torchrun or SLURM's srun started."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import gc
import multiprocessing.connection
import os
import pickle
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

from config import launcher_env
from config.schema import Accelerator, Backend, LauncherConfig, StartMethod, TrainerConfig, taken_signals
from distributed import environment
from distributed.context import OPTIMIZER_IMPORT, DistContext, make_context
from distributed.environment import EnvRank
from distributed.strategies import Strategy
from errors import ConfigError, Preempted, RankFailed, raised_elsewhere

# After one rank fails, the others get this long to leave on their own, then SIGTERM, then SIGKILL.
_GRACE_S = 5.0
_PR_SET_PDEATHSIG = 1  # prctl(2)


@dataclass(frozen=True)
class LaunchPlan:
    launcher: str  # "spawn" | "torchrun" | "slurm", resolved from "auto"
    accelerator: str  # "gpu" | "cpu", resolved from "auto"
    devices: int  # devices per node, as asked (trainer.devices or trainer.gpus)
    processes_per_node: int  # one per device, but dp: one that drives them all
    num_nodes: int
    process_group: bool  # DDP needs one, even at world size 1
    master_addr: str | None  # None: torchrun exported it already
    master_port: int | None  # None: pick a free one (spawn) / torchrun's
    env_rank: EnvRank | None = None  # torchrun/slurm: this process is this one rank
    forward_signals: tuple[signal.Signals, ...] = ()  # passed on to spawned ranks (preemption)
    requeue_signals: tuple[signal.Signals, ...] = ()  # a SLURM job preempted by one of these is requeued
    start_method: str = "spawn"  # "spawn" | "forkserver" | "fork": how the ranks started here begin
    # A GPU job of a Hydra multirun started here (not a torchrun/SLURM rank): even one process runs
    # in a child. A CUDA context costs memory on every GPU it touched and is released only when its
    # process exits, so a sweep's parent that trained one job in-process would hold it on the GPUs
    # its later spawned jobs use. CPU jobs and single runs stay in-process: no context, faster start.
    own_process: bool = False
    host_collectives: bool = False  # a GPU job's process group also takes host tensors (Strategy.host_collectives)
    backend: str | None = None  # launcher.backend; None: the accelerator's own

    @property
    def world_size(self) -> int:
        # Under torchrun/SLURM the environment's: ranks that counted another would wait forever for
        # peers in init_process_group (plan_launch refuses a config that disagrees with it).
        return self.env_rank.world_size if self.env_rank else self.processes_per_node * self.num_nodes

    @property
    def in_process(self) -> bool:
        """This process is the run's one rank (a single run, dp), or one of torchrun's or SLURM's."""
        return self.env_rank is not None or (self.processes_per_node == 1 and not self.own_process)

    @property
    def devices_per_process(self) -> int:
        return self.devices // self.processes_per_node

    def context(self, rank: int, local_rank: int) -> DistContext:
        return make_context(
            rank,
            local_rank,
            self.world_size,
            self.processes_per_node,
            self.accelerator,
            self.process_group,
            self.devices_per_process,
            self.host_collectives,
            self.backend,
        )


def plan_launch(
    settings: TrainerConfig,
    strategy: Strategy,
    launcher: LauncherConfig,
    env: Mapping[str, str] = os.environ,
    multirun: bool = False,
) -> LaunchPlan:
    """Resolve launcher/accelerator/devices against this machine and its environment. `multirun`:
    Hydra runs this job as one of several in this process (`-m`).

    Raises ConfigError on a mismatch, before any process starts.
    """
    name = launcher.name.value
    if name == "auto":
        name = launcher_env.detect(env)
    env_rank = None
    if name == "torchrun":
        env_rank = environment.from_torchrun(env)
    elif name == "slurm":
        fixed = launcher.master_addr  # set: no need to ask scontrol for the first node
        env_rank = environment.from_slurm(env, (lambda _: [fixed]) if fixed else environment.scontrol_hostnames)
    devices = settings.devices_per_node
    # null: the nodes the launcher started (torchrun --nnodes=MIN:MAX); spawn starts this one only.
    num_nodes = settings.num_nodes
    if num_nodes is None:
        num_nodes = env_rank.num_nodes if env_rank is not None else 1
    accelerator = Accelerator.gpu if settings.gpus is not None else settings.accelerator
    visible = torch.cuda.device_count()  # counts without creating a CUDA context
    if accelerator == Accelerator.auto:
        accelerator = Accelerator.gpu if visible else Accelerator.cpu
    if devices < 1 or num_nodes < 1:
        raise ConfigError(f"trainer.devices={devices} trainer.num_nodes={num_nodes}: need at least 1 of each")
    processes = strategy.processes_per_node(devices)
    if env_rank is not None:
        _check_world(env_rank, strategy, devices, num_nodes, accelerator, env)
    elif num_nodes > 1:
        raise ConfigError(
            f"trainer.num_nodes={num_nodes} with launcher={name}, which starts processes on this machine only; "
            "start each node with torchrun (--nnodes) or srun (sbatch slurm/train.sbatch)"
        )
    if accelerator == Accelerator.gpu:
        bound = env_rank is not None and processes == devices and _bound_to_one_gpu(env_rank)
        _check_gpus(devices, visible, bound, strategy.name, shorthand=settings.gpus is not None)
    strategy.check(settings, accelerator, devices, num_nodes)
    if launcher.start_method == StartMethod.fork and accelerator == Accelerator.gpu:
        raise ConfigError(
            "launcher.start_method=fork cannot start GPU ranks: CUDA does not work in a forked process; "
            "use launcher.start_method=forkserver (or spawn)"
        )
    if launcher.backend == Backend.nccl and accelerator == Accelerator.cpu:
        raise ConfigError("launcher.backend=nccl takes GPUs only; on CPU use launcher.backend=gloo, or null")
    if strategy.process_group and env_rank is None and launcher.master_port is not None:
        _check_port_free(launcher.master_addr or "127.0.0.1", int(launcher.master_port))
    return LaunchPlan(
        launcher=name,
        accelerator=accelerator.value,
        devices=devices,
        processes_per_node=processes,
        num_nodes=num_nodes,
        process_group=strategy.process_group,
        host_collectives=strategy.host_collectives,
        master_addr=env_rank.master_addr if env_rank else (launcher.master_addr or "127.0.0.1"),
        master_port=launcher.master_port or (env_rank.master_port if env_rank else None),
        env_rank=env_rank,
        own_process=multirun and accelerator == Accelerator.gpu and env_rank is None,
        start_method=launcher.start_method.value,
        backend=launcher.backend.value if launcher.backend else None,
    )


def _check_gpus(devices: int, visible: int, one_process_per_gpu_started: bool, strategy: str, shorthand: bool) -> None:
    """Enough GPUs for the processes here, unless each was started bound to its own GPU: then
    this process sees one, cuda:0, and so does every other rank on the node. `shorthand`: the
    count came as trainer.gpus, which also chooses the GPU, so the CPU rehearsal replaces it."""
    if one_process_per_gpu_started and visible == 1:
        return
    if devices > visible:
        key = "trainer.gpus" if shorthand else "trainer.devices"
        rehearsal = f"trainer.accelerator=cpu trainer.devices={devices}"
        if strategy == "dp":
            rehearsal += " strategy=ddp"  # DataParallel splits over GPUs only
        if shorthand:
            rehearsal += f" in place of {key}"
        raise ConfigError(
            f"{key}={devices} asks for {devices} GPU(s) per node but {visible} are visible; rehearse on CPU with {rehearsal}"
        )


def _bound_to_one_gpu(env_rank: EnvRank) -> bool:
    """Whether the launcher may have shown this process its own GPU only. srun can
    (--gpus-per-task=1, --gpu-bind sets CUDA_VISIBLE_DEVICES per task). torchrun does only under
    --virtual-local-rank, which gives every worker LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES=its GPU
    (torch/distributed/elastic/agent/server/local_elastic_agent.py, _set_local_rank_env); without it
    all workers share the node's GPUs, and two on one GPU fail in NCCL ("Duplicate GPU detected").
    Worker 0 cannot tell the two modes apart, but its peers (LOCAL_RANK 1, ...) refuse, and torchrun
    then stops it."""
    return env_rank.launcher == "slurm" or env_rank.local_rank == 0


_PER_NODE_FLAG = {"torchrun": "--nproc-per-node", "slurm": "--ntasks-per-node"}


def _check_world(
    env_rank: EnvRank,
    strategy: Strategy,
    devices: int,
    num_nodes: int,
    accelerator: Accelerator,
    env: Mapping[str, str],
) -> None:
    """Under torchrun/SLURM the environment decides the world; the config must say the same."""
    found, local, nodes = env_rank.launcher, env_rank.local_world_size, env_rank.num_nodes
    if env_rank.world_size != local * nodes:
        # Ranks on the fuller nodes would pass the checks below, count a world that never comes
        # and wait in init_process_group.
        raise ConfigError(
            f"uneven tasks per node: {found} started {env_rank.world_size} process(es) on {nodes} node(s), {local} "
            f"on this one; start the same number on every node ({_PER_NODE_FLAG[found]}=N)"
        )
    if strategy.processes_per_node(local) != local:
        raise ConfigError(
            f"strategy={strategy.name} runs one process per node but {found} started {local} per node; "
            f"start {found} with {_PER_NODE_FLAG[found]}=1, or use strategy=ddp for one process per device"
        )
    processes = strategy.processes_per_node(devices)
    if (processes, num_nodes) != (local, nodes):
        raise ConfigError(
            f"{found} started {local} process(es) per node on {nodes} node(s) "
            f"but trainer.devices={devices} trainer.num_nodes={num_nodes}; set "
            f"trainer.devices={devices if processes == local else local} trainer.num_nodes={nodes}"
        )
    gpus_on_node = env.get("SLURM_GPUS_ON_NODE")
    if found == "slurm" and accelerator == Accelerator.gpu and gpus_on_node and int(gpus_on_node) != devices:
        raise ConfigError(
            f"SLURM gave {gpus_on_node} GPU(s) per node but trainer.devices={devices} and {local} task(s) per node; "
            f"ask for --gpus-per-node={devices} (or --gres=gpu:{devices}), with one task per GPU for strategy=ddp"
        )


def launch(plan: LaunchPlan, worker: Callable[..., Any], *args: Any) -> None:
    """Run `worker(ctx, *args)` once per device; returns when every rank has finished."""
    if plan.env_rank is not None:
        if plan.env_rank.launcher == "torchrun":
            _end_with_agent()  # torchrun exported MASTER_ADDR/PORT
        elif plan.process_group:
            os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = plan.master_addr, str(plan.master_port)
        with _ctrl_c_stops(is_main=plan.env_rank.rank == 0):
            worker(plan.context(plan.env_rank.rank, plan.env_rank.local_rank), *args)
        return
    with _store(plan):
        if plan.in_process:  # CPU, or a single run
            with _ctrl_c_stops(is_main=True):
                _run_rank(0, plan, worker, args)
        else:
            _spawn(plan, worker, args)


@contextlib.contextmanager
def _ctrl_c_stops(is_main: bool) -> Iterator[None]:
    """A rank run in this process: the KeyboardInterrupt of a second Ctrl-C, or of one before its
    watch took SIGINT, is an interruption that saved nothing, as a spawned rank's death by SIGINT is."""
    try:
        yield
    except KeyboardInterrupt:
        raise Preempted(signal.SIGINT, is_main=is_main, saved=False) from None


@contextlib.contextmanager
def _store(plan: LaunchPlan) -> Iterator[None]:
    """The ranks' TCPStore, hosted here while they run, as torchrun's agent hosts its workers': its
    server binds launcher.master_port, or a free port (0) and says which, so no other process can
    take the port between its choice and rank 0's bind (the seeds' fixed 12355 collides with any
    other job on the node). The ranks connect to it as clients (env://, TORCHELASTIC_USE_AGENT_STORE)."""
    if not plan.process_group or plan.master_addr is None:
        yield
        return
    store = dist.TCPStore(plan.master_addr, plan.master_port or 0, is_master=True, wait_for_workers=False)
    hosted = {"MASTER_ADDR": plan.master_addr, "MASTER_PORT": str(store.port), "TORCHELASTIC_USE_AGENT_STORE": "True"}
    before = {var: os.environ.get(var) for var in hosted}
    os.environ.update(hosted)
    try:
        yield
    finally:
        for var, value in before.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
        del store


def _end_with_agent() -> None:
    """A torchrun worker gets SIGTERM once its agent dies, as a spawned rank gets SIGINT once its
    launcher does. The agent forwards only its --signals-to-handle (SIGTERM, SIGINT, SIGHUP,
    SIGQUIT by default): SLURM's USR1, or a SIGKILL, ends it at once and its workers would train on
    as orphans, writing into the run dir. SIGTERM is a preemption signal: where
    trainer.preempt_signals has it, the ranks stop at their next agreed step and save last.pt."""
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:  # the agent died before the request: no signal will come
        os.kill(os.getpid(), signal.SIGTERM)


def _spawn(plan: LaunchPlan, worker: Callable[..., Any], args: tuple) -> None:
    """mp.spawn that passes preemption signals on and reports a failed rank in one line.

    A rank that raises or dies makes torch stop the others (after _GRACE_S); a survivor stuck
    in a collective with the dead rank fails by itself within launcher.timeout_s at the latest.
    """
    if plan.start_method == "forkserver":
        mp.set_forkserver_preload(forkserver_preload(worker))
    ranks = mp.start_processes(
        _spawned_rank,
        args=(plan, worker, args, dict(os.environ)),
        nprocs=plan.processes_per_node,
        join=False,
        start_method=plan.start_method,
    )

    forwarded: list[int] = []

    def forward(signum: int, frame: Any) -> None:
        forwarded.append(signum)
        for process in ranks.processes:
            if process.is_alive():
                os.kill(process.pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in taken_signals(plan.forward_signals)}
    try:
        with _job_control(ranks):
            ended = _until_one_fails(ranks)
        while not ranks.join(grace_period=_GRACE_S):
            pass
    except ProcessExitedException as e:
        if e.exit_code > 128 and e.exit_code - 128 in plan.forward_signals:
            raise Preempted(e.exit_code - 128) from None
        _raise_if_interrupted(ended, forwarded)
        reason = f"killed by {e.signal_name}" if e.signal_name else f"exited with code {e.exit_code}"
        if e.signal_name == "SIGKILL":  # the rank had no chance to say why: who sends it
            reason += " (by hand, or by the kernel when memory ran out: `dmesg` says; then use fewer ranks or a smaller batch)"
        if e.signal_name == "SIGABRT" and plan.process_group and plan.accelerator == "gpu":
            # NCCL's watchdog tears down a rank whose collective outlived the group's timeout
            # (TORCH_NCCL_ASYNC_ERROR_HANDLING's default, SkipCleanUp: ProcessGroupNCCL.hpp): the
            # rank named is then the one that waited, not the one that hung.
            reason += " (NCCL aborts a rank whose collective waited launcher.timeout_s: look for a peer that hung or died first)"
        raise RankFailed(e.error_index, reason) from None
    except ProcessRaisedException:
        _raise_if_interrupted(ended, forwarded)  # a peer's broken connection is the echo of it
        errors = _errors(ranks.error_files)
        # A rank's own check (the optimizer's options, rank 0's download) is the user's to fix, even
        # when a peer's broken connection was written first; a diverged loss stops every rank alike.
        meant_for_people = next((error for _, _, reason, _ in errors if (error := raised_elsewhere(reason))), None)
        if meant_for_people is not None:
            raise meant_for_people from None
        _, rank, reason, traceback = errors[0]
        hung = _hung_rank(ranks, reason)
        if hung is not None:
            raise RankFailed(hung, f"hung: rank {rank} waited launcher.timeout_s for it ({reason})") from None
        raise RankFailed(rank, reason, traceback) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        # torch leaves the traceback a rank wrote in the temp dir: read (above), it would only pile up there.
        for path in ranks.error_files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def _until_one_fails(ranks: mp.ProcessContext) -> dict[int, int]:
    """Wait until every rank has ended or one has ended badly; the exit code of each that has by then.

    torch's join, which follows, stops the ranks still running with SIGTERM, the signal a preemption
    forwards too. A rank it stops was not interrupted by the preemption: a peer had failed first (a
    save that failed as the job stopped, its slow peer's watch already closed, read as "preempted
    ... before the ranks saved last.pt" and hid the disk error)."""
    with _signal_wakes() as signalled:
        while True:
            codes = {rank: process.exitcode for rank, process in enumerate(ranks.processes)}
            running = [ranks.processes[rank].sentinel for rank, code in codes.items() if code is None]
            if not running or any(code for code in codes.values()):  # None: running, 0: done
                return {rank: code for rank, code in codes.items() if code is not None}
            if signalled in multiprocessing.connection.wait([*running, signalled]):
                os.read(signalled, 512)


@contextlib.contextmanager
def _job_control(ranks: mp.ProcessContext) -> Iterator[None]:
    """Ctrl-Z (SIGTSTP) stops the ranks, then this process; SIGCONT (`fg`, `bg`) resumes it, and it
    them. The terminal's signals reach this process's group alone (_spawned_rank): stopped alone, it
    would leave the ranks training on, holding the CPUs and the GPUs, and writing to the terminal."""

    def stop(signum: int, frame: Any) -> None:
        _to_each_rank(ranks, signal.SIGSTOP)  # SIGSTOP, not SIGTSTP, which a handler could take
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)  # stops here; returns once continued
        signal.signal(signal.SIGTSTP, stop)
        # Continued, or never stopped: the kernel drops a SIGTSTP to an orphaned process group (one
        # that no shell in its session can `fg`: started with setsid, or its shell gone), and the
        # ranks, stopped all the same, would wait for a SIGCONT that never comes.
        _to_each_rank(ranks, signal.SIGCONT)

    previous = signal.signal(signal.SIGTSTP, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTSTP, previous)


def _to_each_rank(ranks: mp.ProcessContext, signum: int) -> None:
    """`signum` to each rank still running and to its group: its loader workers stop and go on with
    it. Not so a preemption's signal (`forward`): it goes to the rank alone, since a loader worker
    that took it would end, and its rank fail on the lost worker instead of saving."""
    for process in ranks.processes:
        if process.is_alive():
            try:
                os.killpg(process.pid, signum)
            except ProcessLookupError:  # not yet in a group of its own; or it has just ended
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signum)


@contextlib.contextmanager
def _signal_wakes() -> Iterator[int]:
    """A pipe that every signal this process takes writes a byte to, to wait on beside the ranks.
    The kernel may hand a signal to any thread (the TCPStore server's, here), and Python runs its
    handler in the main thread only once that thread's wait returns: here, once a rank had ended.
    A Ctrl-C, which reaches the ranks only as this process's copy, waited for the end of training."""
    read, write = os.pipe()
    os.set_blocking(write, False)  # as set_wakeup_fd requires; the read end is read only once ready
    previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    try:
        yield read
    finally:
        signal.set_wakeup_fd(previous)
        os.close(read)
        os.close(write)


def _raise_if_interrupted(ended: dict[int, int], forwarded: list[int]) -> None:
    """A rank killed by a preemption signal this launcher passed on had no watch to note it yet
    (it was starting), or was stopped at once by a second Ctrl-C: the job was interrupted, not failed.
    `ended`: the exit codes of the ranks that had ended when the first failure was seen
    (_until_one_fails); a peer's error that followed such a death is its echo."""
    signum = next((sig for sig in forwarded for code in ended.values() if code == -sig), None)
    if signum is not None:
        raise Preempted(signum, saved=False) from None


def forkserver_preload(worker: Callable[..., Any]) -> list[str]:
    """What the forkserver imports once, so that no rank forked from it imports it again (seconds of
    CPU each; BENCHMARKS.md: Start-up): train.py (`__main__`), the worker's module and the first optimizer step's import.
    CUDA allows forkserver as it does spawn (not fork) as long as the server never initializes
    CUDA, and none of these imports does (tests/test_launchers.py checks)."""
    return ["__main__", OPTIMIZER_IMPORT, worker.__module__]


def _hung_rank(ranks: mp.ProcessContext, first_error: str) -> int | None:
    """After a collective timed out: a rank that raised nothing and had to be killed. It was alive
    but stuck, since a rank that merely waited on a failed peer would have failed by itself."""
    if "timed out" not in first_error.lower():
        return None
    return next(
        (
            rank
            for rank, (process, error_file) in enumerate(zip(ranks.processes, ranks.error_files))
            if process.exitcode is not None and process.exitcode < 0 and not os.path.exists(error_file)
        ),
        None,
    )


def _errors(error_files: list[str]) -> list[tuple[int, int, str, str]]:
    """(when written, rank, the traceback's last line, the traceback) of every rank that raised, the
    first written first: its peers' errors are mostly the echo of it."""
    written = []
    for rank, path in enumerate(error_files):
        if os.path.exists(path):
            with open(path, "rb") as f:
                traceback = pickle.load(f).strip()
            lines = [line for line in traceback.splitlines() if line.strip()]
            written.append((os.stat(path).st_mtime_ns, rank, lines[-1].strip()[:500], traceback))
    return sorted(written)


def _spawned_rank(
    local_rank: int, plan: LaunchPlan, worker: Callable[..., Any], args: tuple, environ: dict[str, str]
) -> None:
    """A spawned rank reports preemption through its exit code, 128 + the signal, as a shell does."""
    # A rank runs in the environment its launch had (MASTER_PORT, ...). A forkserver's rank would
    # otherwise get the server's, from the first launch: in a sweep, an earlier job's port.
    if os.environ != environ:
        os.environ.clear()
        os.environ.update(environ)
    # The terminal's Ctrl-C goes to every process of its foreground group. In a group of its own (as
    # torchrun's agent starts its workers in a session of their own) a rank gets it once, as the copy
    # its launcher passes on (_spawn), and never takes that copy for a second Ctrl-C however late a
    # busy machine delivers it: a second Ctrl-C stops a rank at once, unsaved.
    os.setpgid(0, 0)
    # torch.multiprocessing asks the kernel to send a rank SIGINT when its launcher dies
    # (PR_SET_PDEATHSIG), but a launcher started in the background (`python train.py &` in a
    # script, a test runner) passes SIGINT on ignored: the orphaned ranks would train on and keep
    # writing checkpoints into the run dir. Python's own handler ends them with KeyboardInterrupt,
    # until the run's preemption watch takes SIGINT (trainer.preempt_signals): they then stop as on
    # Ctrl-C, saving last.pt.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _run_rank(local_rank, plan, worker, args)
    except Preempted as e:
        code = e.exit_code
    except KeyboardInterrupt:
        # Ctrl-C before the preemption watch took SIGINT, or a second one. torch's wrapper would
        # swallow it and the rank exit 0, its peers then failing on its closed connection (a job
        # stopped as the ranks started ended 0, having trained nothing). It ends by the signal, as
        # Python's own Ctrl-C does, for the launcher to say so; its exit handlers first, as an exit
        # runs them (multiprocessing's would otherwise leave the resource tracker a semaphore to warn of).
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher's copy of that Ctrl-C, during them
        atexit._run_exitfuncs()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        raise
    else:
        code = 0
    finally:
        skip_collection_at_exit()  # a rank that raised leaves through torch's error file and the interpreter
    if plan.start_method == "spawn":  # a fresh interpreter, finalized as it exits; forked ranks end in os._exit
        end_process(code)
    sys.exit(code)


def skip_collection_at_exit() -> None:
    """Call as a process ends: Python's collections at exit walk every object not yet frozen, what
    was imported and made after train.py froze its imports (torch._dynamo, TensorBoard, the run's
    own; BENCHMARKS.md: Default job, time to accuracy). Objects still alive then need not be
    finalized (Python's own rule), and a run has closed all it writes by this point."""
    gc.freeze()


def end_process(code: object = 0) -> NoReturn:
    """Leave as `sys.exit(code)` would, less the interpreter's finalization, which can abort a run
    that ended well (BENCHMARKS.md: issue 40, every finished run exits 0).

    A gloo group may outlive destroy_process_group (an FSDP run's DTensor caches hold its mesh, and
    the mesh the group), and its worker threads with it. A worker that drops a finished collective
    whose tensor's Python object has state of its own (a Parameter's, a DTensor's) takes the GIL to
    free that object; if it waits for the GIL as finalization begins, CPython ends the thread with
    pthread_exit once it gets it, and the unwinding through the work's destructor calls
    std::terminate: "terminate called without an active exception", SIGABRT, after metrics.json and
    the checkpoints were written. So what finalization does that a run needs is done here, while the
    interpreter is whole (threads joined, exit handlers run: logging's flush, multiprocessing's,
    the loggers'; the streams flushed), and the process ends with os._exit."""
    skip_collection_at_exit()
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit's rule: anything else is printed, status 1
        print(code, file=sys.stderr)
        code = 1
    threading._shutdown()  # what the interpreter's exit does first: join the threads that are not daemons
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run_rank(local_rank: int, plan: LaunchPlan, worker: Callable[..., Any], args: tuple) -> None:
    worker(plan.context(local_rank, local_rank), *args)


def _check_port_free(addr: str, port: int) -> None:
    """The ranks' store listens on launcher.master_port: say now that it cannot."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the TCPStore binds
        try:
            s.bind((addr, port))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise ConfigError(
                    f"launcher.master_addr={addr}: cannot listen there ({e.strerror}); use 127.0.0.1"
                ) from None
            raise ConfigError(
                f"launcher.master_port={port} is already in use on {addr}; pick another port "
                "or leave launcher.master_port=null for a free one"
            ) from None

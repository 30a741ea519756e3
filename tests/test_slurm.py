"""A first cluster run, rehearsed on two nodes of this machine (slurm/rig.sh): torchrun across two
network namespaces, and SLURM with a slurmd on each node (srun, sbatch, submitit). Requeues:
test_slurm_requeue.py, on a rig of its own (its waits overlap this file's).

Every path a node sees must lie inside the rig's dir: each node has a /tmp of its own. Runs go to
`Rig.runs` (what the nodes see: shared, or each node's own) and are read back from `Rig.shared`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from config.setup import ROOT
from tests.dataset_files import write_idx
from tests.runs import same_weights

pytestmark = pytest.mark.slow

RIG = ROOT / "slurm" / "rig.sh"
TINY = ["debug=ddp_cpu", "trainer.devices=1", "trainer.num_nodes=2"]  # one rank on each node
# SlowNet sleeps 0.2 s in every forward: slow enough for a signal to land mid-training however long
# a job takes to start. 16 steps an epoch, a checkpoint every 2: the first says training is under way.
SLOW = [
    "trainer.accelerator=cpu",
    "trainer.limit_train_batches=16",
    "trainer.limit_val_batches=2",
    "trainer.checkpoint_every_n_steps=2",
    "trainer.progress_bar=false",
    "strategy=ddp",
]
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


@dataclass
class Rig:
    dir: Path
    env: dict[str, str]  # a client's: SLURM_CONF, this python first on PATH, GLOO_SOCKET_IFNAME

    @property
    def runs(self) -> Path:
        """The run dirs' root as the nodes see it."""
        return self.dir / "runs"

    @property
    def shared(self) -> Path:
        """The same, as this machine sees it while the rig shares it."""
        return self.dir / "shared"

    def on(
        self, node: str, cmd: list[str], cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(RIG), "on", str(self.dir), node, *cmd],
            cwd=cwd,
            env=env or self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(
        self,
        node: str,
        cmd: list[str],
        out: Path,
        cwd: Path = ROOT,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen:
        return subprocess.Popen(
            ["bash", str(RIG), "on", str(self.dir), node, *cmd],
            cwd=cwd,
            env=env or self.env,
            stdout=open(out, "w"),
            stderr=subprocess.STDOUT,
            text=True,
        )

    def job(self, job: str) -> dict[str, str]:
        shown = self.on("a", ["scontrol", "show", "job", "-o", job]).stdout
        return {key: re.search(rf"\b{key}=(\S*)", shown)[1] for key in ("JobState", "Restarts", "ExitCode")}

    def requeued(self, job: str, times: int) -> bool:
        """SLURM has requeued the job `times` times; a job that ended instead fails the test at once,
        not at the end of the wait."""
        state = self.job(job)
        assert state["JobState"] not in ENDED, f"job {job} ended before its requeue {times}: {state}"
        return state["Restarts"] == str(times)

    def idle(self) -> bool:
        return self.on("a", ["sinfo", "-h", "-o", "%T"]).stdout.split() == ["idle"]

    def ended(self, process: subprocess.Popen, out: Path, timeout: float = 180) -> int:
        """The exit code of `process` (from `start`, writing to `out`). One that has not ended in
        `timeout` fails the test inside pytest's own timeout, saying where it stuck: its output, what
        SLURM says of its nodes and jobs, its controller's log, and submitit's logs of each job."""
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            asked = [["sinfo", "-N", "-h", "-o", "%N %T %E"], ["scontrol", "show", "job", "-o"]]
            parts = [out.read_text()[-3000:], *(self.on("a", cmd, timeout=30).stdout for cmd in asked)]
            for log in [self.dir / "slurm" / "slurmctld.log", *sorted(self.shared.glob("**/.submitit/*/*_log.*"))]:
                parts.append(f"--- {log}:\n" + log.read_text(errors="replace")[-2000:])
            pytest.fail(f"{shlex.join(process.args[5:])} did not end in {timeout:.0f} s:\n" + "\n".join(parts))


@contextmanager
def rig_up(state: Path, *options: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`slurm/rig.sh up` in `state` (its stdout: the client's SLURM_CONF under --slurm), down at the
    end. A machine that cannot start it skips the test, or under CI=true fails it."""
    up = subprocess.run(
        ["bash", str(RIG), "up", str(state), *options], env=env, capture_output=True, text=True, timeout=300
    )
    if up.returncode == 3:
        reason = f"cannot start the rig here: {up.stderr.strip().splitlines()[-1]}"
        if os.environ.get("CI") == "true":  # CI must run these tests, not report them skipped
            pytest.fail(reason)
        pytest.skip(reason)
    assert up.returncode == 0, up.stderr
    try:
        yield up.stdout
    finally:
        subprocess.run(["bash", str(RIG), "down", str(state)], timeout=120)


@pytest.fixture(scope="module")
def rig(tmp_path_factory) -> Rig:
    """Two nodes and their SLURM, up once for this module."""
    state = tmp_path_factory.mktemp("rig")
    # The nodes' CPUs come from the CPUs this process may use; the jobs' from what each asks for.
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    with rig_up(state, "--slurm", env=env) as up:
        conf = up.strip().removeprefix("export SLURM_CONF=")
        # `python` in the sbatch template must be this interpreter; rig0 joins the nodes.
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
        yield Rig(state, {**os.environ, "SLURM_CONF": conf, "PATH": path, "GLOO_SOCKET_IFNAME": "rig0"})


# How often a wait polls: asking SLURM (scontrol, sinfo) starts processes on a node and has slurmctld
# answer; looking at a file or at /proc costs next to nothing.
ASK_SLURM_S = 1.0
LOOK_S = 0.25


def _wait(what: str, ready: Callable[[], bool], out: Path, timeout: float = 180, every: float = LOOK_S) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"no {what} after {timeout:.0f} s:\n{out.read_text()[-3000:]}"
        time.sleep(every)


def _placements(run_dir: Path) -> dict[str, str]:
    """The ranks-by-host line: {host: its ranks' placements}."""
    line = re.search(r"ranks by host: (.*)", (run_dir / "train.log").read_text())[1]
    return dict(part.split(": ", 1) for part in line.split("; "))


def _assert_one_ddp_run(run_dir: Path) -> None:
    """Rank 0 alone wrote the run dir, and the ranks ran on both nodes."""
    assert sorted(p.name for p in (run_dir / ".hydra").iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    log = (run_dir / "train.log").read_text()
    assert "[rank " not in log
    assert json.loads((run_dir / "metrics.json").read_text())["world_size"] == 2
    assert sorted(_placements(run_dir)) == ["rig-a", "rig-b"]


def test_sbatch_template_on_two_nodes_binds_each_rank_to_the_cpus_it_asked_for(rig):
    """`sbatch --cpus-per-task=2`: since SLURM 22.05 an srun inside does not inherit it. Where its
    step gets only what it asks for (--exact, here SLURM_EXACT=1) each task is bound to one CPU while
    SLURM_CPUS_PER_TASK still says 2. The template must pass it on, and a rank must never take more
    threads or loader workers than the CPUs it is bound to (task/affinity binds them here)."""
    runs = rig.runs / "template"
    write_idx(rig.shared / "mnist")  # images decoded and erased one at a time: in loader workers
    per_image = [
        "dataset=mnist",
        f"dataset.root={rig.runs / 'mnist'}",
        "dataset.download=false",
        "dataset.random_erase=0.1",
        "data.num_workers=null",
    ]
    cmd = [
        "sbatch",
        "--parsable",
        f"--output={runs}.out",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=2",
        "--gres=gpu:0",
        str(ROOT / "slurm" / "train.sbatch"),
        *TINY,
        *per_image,
        f"hydra.run.dir='{runs}/${{run_name:${{launcher.name}},clock}}'",
    ]
    env = {k: v for k, v in rig.env.items() if k != "OMP_NUM_THREADS"} | {
        "SLURM_EXACT": "1"
    }  # threads: the rank's choice
    submitted = rig.on("a", cmd, env=env)
    assert submitted.returncode == 0, submitted.stderr
    job, out = submitted.stdout.strip(), rig.shared / "template.out"
    # sbatch --wait polls every 10 s or so
    _wait("end", lambda: rig.job(job)["JobState"] in ENDED, out, every=ASK_SLURM_S)
    assert rig.job(job)["JobState"] == "COMPLETED", out.read_text()[-3000:]
    (run_dir,) = (rig.shared / "template").iterdir()
    assert run_dir.name.startswith("slurm-")
    _assert_one_ddp_run(run_dir)
    for host, placement in _placements(run_dir).items():
        cpus, threads, workers = re.fullmatch(
            r"\d+ cpu \(CPUs (\S+), (\d+) threads, (\d+) loader workers\)", placement
        ).groups()
        bound = sum(int(b or a) - int(a) + 1 for a, _, b in (span.partition("-") for span in cpus.split(",")))
        assert bound == 2 and int(threads) <= bound and 0 < int(workers) <= bound, (host, placement)


def test_srun_two_nodes_train_fsdp_like_spawn(rig, fsdp_reference):
    runs = rig.runs / "fsdp"
    cmd = [
        "srun",
        "--nodes=2",
        "--ntasks=2",
        "--cpus-per-task=2",
        "--kill-on-bad-exit=1",
        sys.executable,
        str(ROOT / "train.py"),
        *TINY,
        "strategy=fsdp",
        f"hydra.run.dir={runs}",
    ]
    result = rig.on("a", cmd)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = rig.shared / "fsdp"
    _assert_one_ddp_run(run_dir)
    # Each node's task wrote its shards into the one run dir: DCP names each rank's file __<rank>_0.distcp.
    last = run_dir / "checkpoints" / "last.pt"
    assert sorted(p.name for p in last.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert json.loads((run_dir / "metrics.json").read_text())["strategy"] == "fsdp"
    assert same_weights(run_dir, fsdp_reference)


def _srun_fails(rig: Rig, *overrides: str, env: dict[str, str] | None = None, timeout_s: int = 30) -> list[str]:
    """A 2-node srun of train.py that must fail within launcher.timeout_s (start-up aside): its ranks'
    `error:` lines. Without train.sbatch's --kill-on-bad-exit, so that srun's kill neither hides a rank
    that would hang nor cuts off the line of the rank that exits second."""
    cmd = [
        "srun",
        "--nodes=2",
        "--ntasks=2",
        "--cpus-per-task=2",
        sys.executable,
        str(ROOT / "train.py"),
        *TINY,
        f"launcher.timeout_s={timeout_s}",
        *overrides,
    ]
    started = time.monotonic()
    result = rig.on("a", cmd, env=env, timeout=4 * timeout_s + 60)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    # The ranks' start-up (imports, Hydra) on this loaded machine takes part of the wait.
    assert time.monotonic() - started < timeout_s + 30, result.stderr[-3000:]
    assert errors, result.stderr[-3000:]
    return errors


def test_a_run_dir_each_node_has_its_own_of_stops_every_rank_in_one_line(rig, ddp_reference):
    """Node a's run dir holds a last.pt that node b's lacks: rank 0 would resume while rank 1 started
    afresh. Every rank stops, naming the cause, before any trains."""
    (rig.dir / "a" / "runs" / "local" / "checkpoints").mkdir(parents=True)
    last = rig.dir / "a" / "runs" / "local" / "checkpoints" / "last.pt"
    shutil.copy(ddp_reference / "checkpoints" / "last.pt", last)
    subprocess.run(["bash", str(RIG), "runs", str(rig.dir), "node-local"], check=True, timeout=60)
    try:
        errors = _srun_fails(rig, f"hydra.run.dir={rig.runs / 'local'}", "trainer.resume=auto")
    finally:
        subprocess.run(["bash", str(RIG), "runs", str(rig.dir), "shared"], check=True, timeout=60)
    assert len(errors) == 2 and all(
        "error: the run dir is not shared between nodes: rank 0 resumes from" in e for e in errors
    ), errors
    assert "but rank 1 on rig-b sees no checkpoint" in errors[0], errors
    log = rig.dir / "a" / "runs" / "local" / "train.log"
    assert not log.exists() or "epoch 1/1" not in log.read_text()
    assert last.read_bytes() == (ddp_reference / "checkpoints" / "last.pt").read_bytes()


def test_ranks_on_two_nodes_refuse_a_loopback_interface_in_one_line(rig):
    """GLOO_SOCKET_IFNAME=lo: each rank would tell its peers 127.0.0.1, a connection to its own node.
    The peer that connects fails at once; the one that listens would wait 5 x launcher.timeout_s."""
    errors = _srun_fails(
        rig, "hydra.run.dir=/nonexistent/never", env={**rig.env, "GLOO_SOCKET_IFNAME": "lo"}, timeout_s=20
    )
    assert len(errors) == 2 and all(e.startswith("error: GLOO_SOCKET_IFNAME=lo is loopback") for e in errors), errors


def test_sigterm_to_torchrun_agents_saves_last_pt_at_the_step_the_ranks_stopped_within_the_grace_period(rig):
    """torchrun on each node (c10d rendezvous across the rig). Node a's agent gets SIGUSR1, which
    torchrun does not handle by default: it dies at once, and its rank must not train on as an
    orphan. Node b's gets SIGTERM, which it forwards, then SIGKILLs after --shutdown-timeout. The
    ranks agree on one step inside trainer.preempt_grace_s, and rank 0 saves that step."""
    grace = 8
    runs = rig.runs / "torchrun"
    rendezvous = [
        "--nnodes=2",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.250.0.1:29400",
        "--rdzv-id=rehearsal",
        f"--shutdown-timeout={grace}",
    ]
    # Names resolve between the rig's nodes but each maps its own to 127.0.1.1: each node tells the
    # others its address (--local-addr), and node a, whose name is not the endpoint's, hosts the store.
    node_args = {"a": ["--local-addr=10.250.0.1", "--rdzv-conf=is_host=1"], "b": ["--local-addr=10.250.0.2"]}
    train = [
        str(ROOT / "train.py"),
        *SLOW,
        *TINY[1:],
        "model._target_=tests.faults.SlowNet",
        "trainer.batch_size=16",
        "trainer.limit_train_batches=60",
        "trainer.epochs=1",
        f"trainer.preempt_grace_s={grace}",
        f"hydra.run.dir={runs}",
    ]
    out = {node: rig.shared / f"torchrun-{node}.out" for node in "ab"}
    agents = {
        node: rig.start(
            node, [sys.executable, "-m", "torch.distributed.run", *rendezvous, *node_args[node], *train], out[node]
        )
        for node in "ab"
    }
    last = rig.shared / "torchrun" / "checkpoints" / "last.pt"
    try:
        _wait("checkpoint", last.exists, out["a"])
        ranks = {node: _children(agents[node].pid) for node in "ab"}  # `rig.sh on` execs the agent itself
        sent = time.monotonic()
        agents["a"].send_signal(signal.SIGUSR1)
        agents["b"].send_signal(signal.SIGTERM)
        for node in "ab":
            agents[node].wait(timeout=60)
        _wait(
            "ranks gone", lambda: not any(_alive(pid) for pids in ranks.values() for pid in pids), out["b"], timeout=60
        )
        took = time.monotonic() - sent
    finally:
        for agent in agents.values():
            agent.kill()
    log = (rig.shared / "torchrun" / "train.log").read_text()
    assert sorted(_placements(rig.shared / "torchrun")) == ["rig-a", "rig-b"]
    stopped = re.search(r"SIGTERM: every rank stops after step (\d+); saving last.pt", log)
    assert stopped, f"{log[-2000:]}\n{out['b'].read_text()[-2000:]}"
    assert torch.load(last, weights_only=True)["step"] == int(stopped[1])
    assert took < grace, took


def _children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def test_search_runs_two_trials_at_once_as_slurm_jobs_and_one_killed_fails_alone(rig):
    """Each trial a SLURM job of its own, both held at their first step: in flight at once. One is
    cancelled, its batch script killed at once: as a job killed for memory or on a lost node, it
    ends without a result. This cluster keeps no accounting, so sacct cannot say so, and submitit
    waited for it forever; squeue does. Its trial fails alone, a third takes its place, the search ends."""
    sweep, shared, held = rig.runs / "search", rig.shared / "search", rig.dir / "held"
    held.mkdir()
    (held / "hold").touch()
    cmd = [
        sys.executable,
        "train.py",
        "hparams_search=digits",
        "hydra/launcher=submitit_slurm",
        "hydra.launcher.cpus_per_task=1",
        f"hydra.sweep.dir={sweep}",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.n_jobs=2",
        "trainer.accelerator=cpu",
        "trainer.epochs=1",
        "trainer.limit_train_batches=3",
        "trainer.limit_val_batches=1",
        "trainer.progress_bar=false",
        "+callbacks.held._target_=tests.faults.Held",
    ]
    out = rig.shared / "search.out"
    search = rig.start("a", cmd, out, env={**rig.env, "HELD_DIR": str(held)})
    try:
        _wait("both trials started", lambda: len(list((held / "arrived").glob("*"))) == 2, out)
        # This search's jobs, by their dirs: squeue would also list an earlier test's job still completing.
        killed = min((p.name for p in (shared / ".submitit").iterdir() if p.name.isdigit()), key=int)
        assert rig.on("a", ["scancel", "--signal=KILL", "--full", killed]).returncode == 0
        (held / "hold").unlink()
        assert rig.ended(search, out) == 0, out.read_text()[-3000:]
    finally:
        search.kill()
    log = out.read_text()
    said = (
        rf"trial [01] failed: UncompletedJobError: Job {killed} \(task: 0\) with path \S+\s+has not produced any output"
    )
    assert re.search(said, log), log[-3000:]
    import optuna

    study = optuna.load_study(study_name="digits", storage=f"sqlite:///{shared / 'optuna.db'}")
    trials = study.get_trials()
    assert sorted(t.state.name for t in trials[:2]) == ["COMPLETE", "FAIL"] and trials[2].state.name == "COMPLETE"
    done = [t for t in trials if t.state.name == "COMPLETE"]
    jobs = [shared / t.user_attrs["job"] for t in done]
    assert [json.loads((job / "metrics.json").read_text())["best_val_acc"] for job in jobs] == [t.value for t in done]
    assert len([p for p in (shared / ".submitit").iterdir() if p.name.isdigit()]) == 3

"""An elastic world on the two-node rig (slurm/rig.sh, a rig of this module's own, without SLURM):
torchrun --nnodes=1:2 on each node loses node b mid-epoch, goes on at world 1, and grows back to 2
when b returns, keeping the global batch and the sample order: its loss curve is the unbroken run's."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from config.setup import ROOT
from tests.runs import run_train
from tests.test_slurm import Rig, _children, _wait, rig_up

pytestmark = pytest.mark.slow

# Each step's 16 samples: one micro-batch of 8 per rank at world 2, two of 8 at world 1.
JOB = [
    "strategy=ddp",
    "trainer.accelerator=cpu",
    "trainer.batch_size=16",
    "trainer.max_batch_per_device=8",
    "trainer.epochs=1",
    "trainer.limit_train_batches=30",
    "trainer.limit_val_batches=2",
    "trainer.checkpoint_every_n_steps=2",
    "trainer.preempt_grace_s=2",  # a re-form's SIGTERM: the ranks stop within 0.5 s and save
    "trainer.progress_bar=false",
    "logger=csv",
    "trainer.log_every_n_steps=1",  # every step's loss in metrics.csv
    "model._target_=tests.faults.SlowCNN",  # SimpleCNN: no dropout or BatchNorm, the same math at any split
]
# The shrunk and grown run's loss at each step against the unbroken run's. The same samples make
# each step's loss, summed in another order (a rank's two micro-batches accumulated, or two ranks'
# gradients all-reduced), which moves float32 sums by a few units in their last place; a step that
# trained other samples (a place in the epoch carried over wrong, an order that depended on the
# world) moves the loss by orders of magnitude more than the tolerance, as does a shift by one step
# along the curve. The figures: BENCHMARKS.md, issue 40's elastic world.
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def rig(tmp_path_factory) -> Rig:
    """Two nodes, no SLURM: torchrun needs none."""
    state = tmp_path_factory.mktemp("rig")
    # LOGLEVEL: the agents say when they see a node join. Each restart a store of its own (environment.from_torchrun).
    env = {"GLOO_SOCKET_IFNAME": "rig0", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "LOGLEVEL": "INFO"}
    with rig_up(state):
        yield Rig(state, {**os.environ, **env})


def _losses(run_dir: Path) -> dict[int, float]:
    """Each step's loss in metrics.csv; a step trained again after a restart, its last."""
    rows = csv.DictReader((run_dir / "metrics.csv").open())
    return {int(row["step"]): float(row["train/loss_window"]) for row in rows if row["train/loss_window"]}


def test_a_node_lost_mid_epoch_shrinks_the_world_and_one_that_returns_grows_it_on_the_same_curve(rig, tmp_path):
    unbroken = tmp_path / "unbroken"
    result = run_train(unbroken, *JOB, "trainer.devices=2", "+model.delay_s=0")
    assert result.returncode == 0, result.stderr[-3000:]

    hold = rig.shared / "hold"  # while it exists, the ranks wait in their forward (tests.faults.SlowCNN)
    # The heartbeats: a node is dead after 6 s without one (default 15), and a re-form waits 1 s for
    # more nodes (default 30).
    conf = "last_call_timeout=1,keep_alive_interval=2,keep_alive_max_attempt=3"
    rendezvous = ["--nnodes=1:2", "--nproc-per-node=1", "--rdzv-backend=c10d", "--rdzv-endpoint=10.250.0.1:29400"]
    rendezvous += ["--rdzv-id=elastic", "--max-restarts=1"]
    node_args = {
        "a": ["--local-addr=10.250.0.1", f"--rdzv-conf=is_host=1,{conf}"],
        "b": ["--local-addr=10.250.0.2", f"--rdzv-conf={conf}"],
    }
    train = [str(ROOT / "train.py"), *JOB, "trainer.num_nodes=null", "+model.delay_s=0.05"]
    train += [f"+model.hold={rig.runs / 'hold'}", f"hydra.run.dir={rig.runs / 'elastic'}"]
    out = {node: rig.shared / f"{node}.out" for node in ("a", "b", "b-again")}

    def agent(node: str, out: Path) -> subprocess.Popen:
        torchrun = [sys.executable, "-m", "torch.distributed.run", *rendezvous, *node_args[node], *train]
        return rig.start(node, torchrun, out)

    last = rig.shared / "elastic" / "checkpoints" / "last.pt"

    def saved_at(world: int, after: int = 0) -> bool:
        try:
            checkpoint = torch.load(last, weights_only=True)
        except (OSError, RuntimeError, EOFError):  # none yet, or being replaced as it was read
            return False
        return checkpoint["layout"]["world_size"] == world and checkpoint["step"] > after

    agents = {node: agent(node, out[node]) for node in "ab"}
    try:
        _wait("a checkpoint at world 2", lambda: saved_at(2), out["a"])
        killed = [agents["b"].pid, *_children(agents["b"].pid)]  # `rig.sh on` execs the agent itself
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        step = torch.load(last, weights_only=True)["step"]
        _wait("a checkpoint at world 1", lambda: saved_at(1, after=step), out["a"])
        hold.touch()  # world 1 waits for node b within its next step
        # Counted: under load node a can start alone and see b join once already, before the kill.
        joined = "new nodes from group_rank=0"
        before = out["a"].read_text().count(joined)
        agents["b-again"] = agent("b", out["b-again"])
        _wait("node a's agent to see b", lambda: out["a"].read_text().count(joined) > before, out["a"])
        hold.unlink()
        for node in ("a", "b-again"):
            assert agents[node].wait(timeout=180) == 0, out[node].read_text()[-3000:]
    finally:
        hold.unlink(missing_ok=True)
        for process in agents.values():
            process.kill()

    run_dir = rig.shared / "elastic"
    log = (run_dir / "train.log").read_text()
    changes = re.findall(
        r"world size (\d) -> (\d) \(the checkpoint's -> this run's\): .* samples were (.*), now (.*?)[;,]", log
    )
    assert changes == [
        ("2", "1", "1 micro-batch of 8 per rank", "2 micro-batches of 8 per rank"),
        ("1", "2", "2 micro-batches of 8 per rank", "1 micro-batch of 8 per rank"),
    ], log[-3000:]
    # The grow's SIGTERM is the agent's re-form, not a stop: the log says the group goes on by itself.
    assert "if torchrun is re-forming the group (a node joined or left), it starts the ranks again" in log
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert (metrics["world_size"], metrics["steps"]) == (2, 30)
    losses, expected = _losses(run_dir), _losses(unbroken)
    assert losses.keys() == expected.keys() == set(range(1, 31))
    worst = max(abs(losses[s] - expected[s]) for s in expected)
    assert worst <= TOLERANCE, {
        s: (losses[s], expected[s]) for s in expected if abs(losses[s] - expected[s]) > TOLERANCE
    }

"""distributed/environment.py's reading of torchrun's and srun's variables, case by case: the
defaults when a variable is absent, which of two variables wins, and each error's whole line
(test_launchers.py holds the common cases and the launches)."""

from __future__ import annotations

import os
import socket
import struct
import subprocess

import pytest

from config import launcher_env
from config.setup import ROOT
from distributed import environment
from errors import ConfigError

# srun -n4 over two nodes, two tasks each: rank 3 is node 1's second task.
SLURM = {
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "4",
    "SLURM_NODEID": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_JOB_ID": "4567123",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
}
TORCHRUN = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}


def _from_slurm(env: dict[str, str]) -> environment.EnvRank:
    """from_slurm with scontrol answered here: the first host is the list it was asked to expand."""
    return environment.from_slurm(env, lambda nodelist: [f"first of {nodelist}"])


def _error(call, *args, **kwargs) -> str:
    with pytest.raises(ConfigError) as e:
        call(*args, **kwargs)
    return str(e.value)


@pytest.mark.parametrize(
    "env, found",
    [
        ({"SLURM_STEP_ID": "0"}, "spawn"),  # srun without SLURM_NTASKS: one task
        ({"SLURM_STEP_ID": "0", "SLURM_NTASKS": "2"}, "slurm"),
    ],
)
def test_srun_is_the_launcher_from_two_tasks_on(env, found):
    assert launcher_env.detect(env) == found


@pytest.mark.parametrize(
    "launcher, env, name",
    [
        ("auto", {"RANK": "0"}, "clock"),  # no WORLD_SIZE: one process, its clock is the run's
        ("slurm", {"SLURM_JOB_ID": "5"}, "slurm-5.0"),  # no SLURM_STEP_ID: the job's first step
    ],
)
def test_a_run_dir_name_from_a_partial_environment(launcher, env, name):
    assert launcher_env.run_name(launcher, env, "clock") == name


def test_torchrun_in_a_batch_script_without_a_run_id_is_refused_not_named_by_the_job():
    # SLURM_JOB_ID alone (no srun step): several such torchruns in one job would share the name.
    env = TORCHRUN | {"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "77"}
    assert _error(launcher_env.run_name, "auto", env, "clock") == (
        "TORCHELASTIC_RUN_ID=none: torchrun got no --rdzv-id, so every such run would share one run dir; "
        "start torchrun with --standalone (one node) or --rdzv-id=<a name for this run>, "
        "or set hydra.run.dir=<a dir for this run>"
    )


def test_a_hand_set_world_size_is_refused_in_one_line():
    assert _error(launcher_env.run_name, "auto", TORCHRUN, "clock") == (
        "WORLD_SIZE=2 set by hand (not by torchrun): each process would name its run dir by its own clock and the "
        "ranks could split over two dirs; set hydra.run.dir=<one dir for all ranks>"
    )


def test_rank_zero_is_read_from_the_named_launchers_variable():
    assert launcher_env.is_rank_zero("torchrun", {})  # no RANK: the one process
    assert not launcher_env.is_rank_zero("slurm", {"SLURM_PROCID": "1"})  # named, not detected (no step id here)


def test_a_missing_torchrun_or_srun_variable_is_one_line_naming_the_fix():
    assert _error(environment.from_torchrun, {"RANK": "0"}) == (
        "launcher=torchrun but LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE not set in the environment; start train.py "
        "with torchrun (or set RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT)"
    )
    message = (
        "launcher=slurm but SLURM_PROCID/SLURM_NTASKS are not set; run train.py under srun "
        "(sbatch slurm/train.sbatch), not directly in the batch script"
    )
    assert _error(_from_slurm, {"SLURM_PROCID": "0"}) == message == _error(_from_slurm, {"SLURM_NTASKS": "2"})
    assert _error(environment.tasks_per_node, "2(x") == "SLURM_TASKS_PER_NODE=2(x: cannot read the tasks per node"


def test_srun_without_a_tasks_per_node_or_node_id():
    # Every task on this node; a node id past the counts' list is the last node's.
    env = {k: v for k, v in SLURM.items() if k != "SLURM_TASKS_PER_NODE"}
    assert _from_slurm(env).local_world_size == 4
    uneven = {k: v for k, v in SLURM.items() if k != "SLURM_NODEID"} | {"SLURM_TASKS_PER_NODE": "3,1"}
    assert _from_slurm(uneven).local_world_size == 3  # no SLURM_NODEID: node 0


def test_slurm_localid_beats_the_arithmetic_on_uneven_nodes():
    # One task on the first node, two on the second: rank 2 is the second node's second task.
    env = SLURM | {"SLURM_NTASKS": "3", "SLURM_TASKS_PER_NODE": "1,2", "SLURM_PROCID": "2", "SLURM_LOCALID": "1"}
    assert _from_slurm(env).local_rank == 1
    without = {k: v for k, v in SLURM.items() if k != "SLURM_LOCALID"} | {"SLURM_PROCID": "5", "SLURM_NTASKS": "6"}
    assert _from_slurm(without).local_rank == 1  # seed 002's arithmetic: 2 a node, rank 5 is its node's second


def test_the_steps_node_list_and_count_beat_the_jobs():
    step = SLURM | {"SLURM_STEP_NODELIST": "gpu[09-10]", "SLURM_STEP_NUM_NODES": "3", "SLURM_NNODES": "5"}
    assert (_from_slurm(step).master_addr, _from_slurm(step).num_nodes) == ("first of gpu[09-10]", 3)
    assert _from_slurm(SLURM | {"SLURM_NNODES": "5"}).num_nodes == 5
    bare = {k: v for k, v in SLURM.items() if k != "SLURM_JOB_NODELIST"}
    assert _from_slurm(bare).master_addr == "first of localhost"


@pytest.mark.parametrize("step, offset", [(None, 0), ("3", 3), ("12", 2)])
def test_the_port_is_the_jobs_plus_its_step_modulo_ten(step, offset):
    env = {"SLURM_JOB_ID": "4567123"} | ({"SLURM_STEP_ID": step} if step else {})
    assert environment.master_port(env) == 10000 + 4567123 % 2000 * 10 + offset


def test_scontrol_expands_the_node_list_and_its_absence_is_one_line(tmp_path, monkeypatch):
    scontrol = tmp_path / "scontrol"
    scontrol.write_text('#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && echo "$3-a" && echo "$3-b"\n')
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert environment.scontrol_hostnames("n[1-2]") == ["n[1-2]-a", "n[1-2]-b"]
    scontrol.write_text("#!/bin/sh\nexit 1\n")
    assert _error(environment.scontrol_hostnames, "n[1-2]") == (
        "`scontrol show hostnames n[1-2]` failed (Command '['scontrol', 'show', 'hostnames', 'n[1-2]']' returned "
        "non-zero exit status 1.); set launcher.master_addr=<the job's first node>"
    )


def _flags(value: int):
    """fcntl.ioctl answering SIOCGIFFLAGS as the kernel does for an interface with these flags."""
    return lambda fd, request, arg: arg[:16] + struct.pack("H", value)


def _resolving_to(*addresses: str):
    """socket.getaddrinfo of a machine whose hostname, node07, resolves to these addresses."""

    def getaddrinfo(host, port, proto):
        if host != "node07":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, proto, "", (address, 0)) for address in addresses]

    return getaddrinfo


def _unresolvable(host, port, proto):
    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


def test_a_loopback_or_missing_interface_is_refused_in_one_line_naming_the_variable(monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "node07")
    check = environment.check_interfaces
    assert _error(check, True, False, {"GLOO_SOCKET_IFNAME": "lo"}).startswith(
        "GLOO_SOCKET_IFNAME=lo is loopback, which the other nodes cannot reach; set it to the interface"
    )
    assert _error(check, True, False, {"GLOO_SOCKET_IFNAME": "nope0"}).startswith(
        "GLOO_SOCKET_IFNAME=nope0: node07 has no such interface; set it to the interface"
    )
    assert _error(check, False, True, {"NCCL_SOCKET_IFNAME": "=lo"}).startswith("NCCL_SOCKET_IFNAME=lo is loopback")
    # NCCL takes prefixes (eth, ib): a name no interface has passes, and each of a list is checked.
    assert _error(check, False, True, {"NCCL_SOCKET_IFNAME": "nope,lo"}).startswith("NCCL_SOCKET_IFNAME=lo is loopback")
    assert _error(check, True, True, {"GLOO_SOCKET_IFNAME": "lo,", "NCCL_SOCKET_IFNAME": "nope"}).startswith(
        "GLOO_SOCKET_IFNAME=lo is loopback"
    )


def test_interfaces_the_nodes_reach_each_other_on_or_that_nccl_excludes_pass(monkeypatch):
    environment.check_interfaces(False, False, {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"})  # unused
    environment.check_interfaces(False, True, {"NCCL_SOCKET_IFNAME": "^docker,lo"})  # those it must not use
    monkeypatch.setattr(environment.fcntl, "ioctl", _flags(0x8))  # every name loopback: none is asked about
    environment.check_interfaces(False, True, {})  # NCCL_SOCKET_IFNAME unset: NCCL skips loopback by itself
    monkeypatch.setattr(environment.fcntl, "ioctl", _flags(0x1043))  # up, broadcast, running, multicast
    environment.check_interfaces(True, True, {"GLOO_SOCKET_IFNAME": "eth0,eth1", "NCCL_SOCKET_IFNAME": "=ib0"})


def test_gloo_without_an_interface_needs_the_hostname_to_resolve_off_loopback(monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "node07")
    monkeypatch.setattr(socket, "getaddrinfo", _resolving_to("127.0.1.1", "10.0.0.7"))  # Debian's /etc/hosts
    assert _error(environment.check_interfaces, True, False, {}).startswith(
        "GLOO_SOCKET_IFNAME is not set, so gloo binds the address node07 resolves to, 127.0.1.1, which the other "
        "nodes cannot reach; set GLOO_SOCKET_IFNAME to the interface"
    )
    monkeypatch.setattr(socket, "getaddrinfo", _resolving_to())
    assert "resolves to, none: then loopback, which" in _error(environment.check_interfaces, True, False, {})
    monkeypatch.setattr(socket, "getaddrinfo", _unresolvable)
    assert "resolves to, none: then loopback, which" in _error(environment.check_interfaces, True, False, {})
    monkeypatch.setattr(socket, "getaddrinfo", _resolving_to("10.0.0.7", "127.0.1.1"))
    environment.check_interfaces(True, False, {})


@pytest.mark.parametrize("master", ["127.0.0.1", "127.0.1.1", "localhost", "::1"])
def test_with_rank_0_on_a_loopback_address_every_node_is_this_host_and_loopback_is_right(monkeypatch, master):
    """Two torchrun agents on one host (--rdzv-endpoint=127.0.0.1:PORT): unset, gloo binds loopback;
    GLOO_SOCKET_IFNAME=lo or NCCL_SOCKET_IFNAME=lo is taken as given. A name no interface has is not."""
    monkeypatch.setattr(socket, "gethostname", lambda: "node07")
    monkeypatch.setattr(socket, "getaddrinfo", _resolving_to("127.0.1.1"))  # Debian's /etc/hosts
    here = {"MASTER_ADDR": master}
    environment.check_interfaces(True, True, here)
    environment.check_interfaces(True, True, here | {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"})
    assert _error(environment.check_interfaces, True, False, here | {"GLOO_SOCKET_IFNAME": "nope0"}).startswith(
        "GLOO_SOCKET_IFNAME=nope0: node07 has no such interface"
    )


@pytest.mark.parametrize("master", ["10.0.0.7", "node07", "node07.cluster", ""])
def test_with_rank_0_elsewhere_or_named_the_loopback_refusals_stay(monkeypatch, master):
    """A name counts as elsewhere even where it resolves to loopback: rank 0's own node resolves its
    name to 127.0.1.1 (Debian) while the other nodes reach it at its real address."""
    monkeypatch.setattr(socket, "gethostname", lambda: "node07")
    monkeypatch.setattr(socket, "getaddrinfo", _resolving_to("127.0.1.1"))
    elsewhere = {"MASTER_ADDR": master}
    assert _error(environment.check_interfaces, True, False, elsewhere).startswith(
        "GLOO_SOCKET_IFNAME is not set, so gloo binds the address node07 resolves to, 127.0.1.1"
    )
    assert _error(environment.check_interfaces, True, False, elsewhere | {"GLOO_SOCKET_IFNAME": "lo"}).startswith(
        "GLOO_SOCKET_IFNAME=lo is loopback, which the other nodes cannot reach"
    )
    assert _error(environment.check_interfaces, False, True, elsewhere | {"NCCL_SOCKET_IFNAME": "lo"}).startswith(
        "NCCL_SOCKET_IFNAME=lo is loopback"
    )


def test_torchrun_restarts_into_the_store_of_the_ranks_before_are_refused_in_one_line():
    """torch's agent shares one store with every restart of the group: a restarted rank can read a dead
    rank's address. TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (no agent store) gives each restart its own."""
    restarts = TORCHRUN | {"TORCHELASTIC_MAX_RESTARTS": "1"}
    assert _error(environment.from_torchrun, restarts | {"TORCHELASTIC_USE_AGENT_STORE": "True"}) == (
        "torchrun --max-restarts=1 would restart the ranks into the store the ranks before them wrote, where a "
        "restarted rank can meet a dead rank's address; start torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "
        "in its environment, which gives each restart a store of its own"
    )
    assert environment.from_torchrun(restarts | {"TORCHELASTIC_USE_AGENT_STORE": "False"}).rank == 1
    assert environment.from_torchrun(
        TORCHRUN | {"TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    )
    assert environment.from_torchrun(TORCHRUN | {"TORCHELASTIC_USE_AGENT_STORE": "True"})  # no restarts given: none


def test_an_address_resolves_to_itself_without_a_lookup():
    assert environment._resolved("127.0.0.1") == "127.0.0.1"  # numeric: no resolver asked


def test_on_one_node_a_named_interface_must_exist_and_nothing_else_is_asked(monkeypatch):
    # Spawned ranks met gloo's "enforce fail ... Unable to find address for: nope0", which names no variable.
    monkeypatch.setattr(socket, "gethostname", lambda: "node07")
    monkeypatch.setattr(socket, "getaddrinfo", _resolving_to("127.0.1.1"))  # would be refused on several nodes
    one = dict(one_node=True)
    environment.check_interfaces(True, True, {"MASTER_ADDR": "node07"}, **one)
    environment.check_interfaces(True, True, {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}, **one)
    assert _error(environment.check_interfaces, True, False, {"GLOO_SOCKET_IFNAME": "nope0"}, **one) == (
        "GLOO_SOCKET_IFNAME=nope0: node07 has no such interface; unset it (every rank runs on node07), "
        "or name one `ip -br addr` lists"
    )


def test_the_sbatch_template_run_with_bash_is_one_line_naming_sbatch():
    """Outside a job it read SLURM_NTASKS and stopped at bash's `unbound variable`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    result = subprocess.run(
        ["bash", str(ROOT / "slurm" / "train.sbatch"), "debug=fdr"], env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        "error: slurm/train.sbatch runs as a SLURM job: submit it with sbatch slurm/train.sbatch [overrides], or "
        "train on this machine with python train.py [overrides]\n"
    )

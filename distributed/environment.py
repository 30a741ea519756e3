"""Who this process is when torchrun or SLURM's srun started it: read from their environment.

Pure functions of an env mapping, so each launcher's parsing is testable without processes.
"""

from __future__ import annotations

import fcntl
import ipaddress
import re
import socket
import struct
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from config.launcher_env import TORCHRUN_VARS
from errors import ConfigError

_SIOCGIFFLAGS, _IFF_LOOPBACK = 0x8913, 0x8  # netdevice(7)
_FIND_IT = (
    "the interface the nodes reach each other on (`ip -br addr` lists them; docs/clusters.md), or, with every "
    "node on this host, give rank 0's address as 127.0.0.1 (torchrun --local-addr=127.0.0.1 on every node)"
)


@dataclass(frozen=True)
class EnvRank:
    """This process's place in a world that an external launcher started."""

    launcher: str  # "torchrun" | "slurm"
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int  # processes on this node
    num_nodes: int
    master_addr: str | None  # None: the launcher already exported it (torchrun)
    master_port: int | None


def from_torchrun(env: Mapping[str, str]) -> EnvRank:
    missing = [var for var in (*TORCHRUN_VARS, "LOCAL_WORLD_SIZE") if var not in env]
    if missing:
        raise ConfigError(
            f"launcher=torchrun but {', '.join(missing)} not set in the environment; "
            "start train.py with torchrun (or set RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT)"
        )
    restarts = int(env.get("TORCHELASTIC_MAX_RESTARTS") or 0)
    if restarts and env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torch's agent keeps one store for every restart of the group, so a restarted rank may read
        # the address a rank of the group before left there, dead since, and fail to connect (the
        # group's keys are the same each time: pytorch/pytorch#135712; seen here in most restarts).
        raise ConfigError(
            f"torchrun --max-restarts={restarts} would restart the ranks into the store the ranks before them "
            "wrote, where a restarted rank can meet a dead rank's address; start torchrun with "
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in its environment, which gives each restart a store of its own"
        )
    world, local_world = int(env["WORLD_SIZE"]), int(env["LOCAL_WORLD_SIZE"])
    return EnvRank(
        launcher="torchrun",
        rank=int(env["RANK"]),
        local_rank=int(env["LOCAL_RANK"]),
        world_size=world,
        local_world_size=local_world,
        num_nodes=int(env.get("GROUP_WORLD_SIZE", world // local_world)),
        master_addr=None,
        master_port=None,
    )


def from_slurm(env: Mapping[str, str], hostnames: Callable[[str], list[str]] | None = None) -> EnvRank:
    """rank/world/local rank from srun's task variables; master = first host, port from the job and step."""
    if "SLURM_PROCID" not in env or "SLURM_NTASKS" not in env:
        raise ConfigError(
            "launcher=slurm but SLURM_PROCID/SLURM_NTASKS are not set; run train.py under srun "
            "(sbatch slurm/train.sbatch), not directly in the batch script"
        )
    rank, world = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
    node = int(env.get("SLURM_NODEID", 0))
    per_node = tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or str(world))
    local_world = per_node[min(node, len(per_node) - 1)]
    if "SLURM_LOCALID" in env:
        local_rank = int(env["SLURM_LOCALID"])
    else:  # seed 002's arithmetic, right when every node runs the same number of tasks
        local_rank = rank - local_world * (rank // local_world)
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "localhost")
    return EnvRank(
        launcher="slurm",
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=local_world,
        num_nodes=int(env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES") or len(per_node)),
        master_addr=(hostnames or scontrol_hostnames)(nodelist)[0],
        master_port=master_port(env),
    )


def master_port(env: Mapping[str, str]) -> int:
    """Rank 0's port. `srun --resv-ports` reserves ports for its step on each node
    (SLURM_STEP_RESV_PORTS, e.g. 12000-12004): the first is no other step's. Else from the job and
    its srun step: every array task has a job id of its own (SLURM_ARRAY_JOB_ID is the one they
    share), and two steps of one job may run at once. Jobs 2000 apart or steps 10 apart meet;
    10000-29999 stays below Linux's ephemeral ports (32768+), which outgoing connections take."""
    reserved = re.match(r"\d+", env.get("SLURM_STEP_RESV_PORTS", ""))
    if reserved:
        return int(reserved[0])
    return 10000 + int(env["SLURM_JOB_ID"]) % 2000 * 10 + int(env.get("SLURM_STEP_ID") or 0) % 10


def tasks_per_node(spec: str) -> list[int]:
    """SLURM's compressed counts, e.g. "2(x3),1" -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise ConfigError(f"SLURM_TASKS_PER_NODE={spec}: cannot read the tasks per node")
        counts += [int(match[1])] * int(match[2] or 1)
    return counts


def scontrol_hostnames(nodelist: str) -> list[str]:
    """`scontrol show hostnames` expands "node[01-03],gpu7" the way SLURM means it."""
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise ConfigError(
            f"`scontrol show hostnames {nodelist}` failed ({e}); set launcher.master_addr=<the job's first node>"
        ) from e
    return out.stdout.split()


def check_interfaces(gloo: bool, nccl: bool, env: Mapping[str, str], one_node: bool = False) -> None:
    """An interface named for gloo must exist on this host: gloo's own refusal, an "enforce fail",
    names no variable to fix.

    Ranks on several nodes must not talk over loopback, where gloo's default often lands: it binds
    the address the hostname resolves to, and Debian's /etc/hosts maps that to 127.0.1.1. A peer
    told that address connects to its own node and fails (connection refused), while the rank that
    waits for it hangs well past launcher.timeout_s. NCCL skips loopback unless told.

    Unless rank 0's address (MASTER_ADDR) is loopback itself: every rank reaches rank 0 there, so
    every "node" runs on this one host (two torchrun agents rehearsing multi-node with
    --rdzv-endpoint=127.0.0.1:PORT), and loopback is right; an interface named then is taken as it
    is. A hostname that resolves to loopback here does not count: on Debian, rank 0's own node
    resolves its name to 127.0.1.1 while the other nodes resolve it to the address they reach.
    `one_node`: every rank runs on this host, as spawn's do: loopback is right too."""
    peers_here = one_node or _loopback(env.get("MASTER_ADDR", ""))
    if gloo:
        names = [name for name in env.get("GLOO_SOCKET_IFNAME", "").split(",") if name]
        missing = (
            f"unset it (every rank runs on {socket.gethostname()}), or name one `ip -br addr` lists"
            if one_node
            else f"set it to {_FIND_IT}"
        )
        for name in names:
            _check_interface("GLOO_SOCKET_IFNAME", name, peers_here, if_missing=missing)
        if not names and not peers_here:
            host = socket.gethostname()
            address = _resolved(host)
            if address is None or ipaddress.ip_address(address).is_loopback:
                raise ConfigError(
                    f"GLOO_SOCKET_IFNAME is not set, so gloo binds the address {host} resolves to, "
                    f"{address or 'none: then loopback'}, which the other nodes cannot reach; "
                    f"set GLOO_SOCKET_IFNAME to {_FIND_IT}"
                )
    ifname = env.get("NCCL_SOCKET_IFNAME", "")
    if nccl and ifname and not ifname.startswith("^"):  # ^: the interfaces it must not use
        for name in ifname.removeprefix("=").split(","):
            # NCCL takes a prefix: eth, ib
            _check_interface("NCCL_SOCKET_IFNAME", name, peers_here, if_missing=None)


def _loopback(address: str) -> bool:
    """An address that means this host on every host: `localhost`, 127.0.0.0/8, ::1."""
    if address.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:  # a hostname, or nothing
        return False


def _check_interface(var: str, name: str, loopback_ok: bool, if_missing: str | None) -> None:
    """`if_missing`: the fix to name when this host has no interface `name`; None: a name that may
    be missing (NCCL takes prefixes: eth, ib)."""
    host = socket.gethostname()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            request = struct.pack("16sH", name.encode()[:15], 0)
            flags = struct.unpack("16sH", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, request)[:18])[1]
    except OSError:
        if if_missing is not None:
            raise ConfigError(f"{var}={name}: {host} has no such interface; {if_missing}") from None
        return
    if flags & _IFF_LOOPBACK and not loopback_ok:
        raise ConfigError(f"{var}={name} is loopback, which the other nodes cannot reach; set it to {_FIND_IT}")


def _resolved(host: str) -> str | None:
    try:
        return socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)[0][4][0]
    except (OSError, IndexError):
        return None

"""What a platform's variables say (Cluster), and the small rules the platforms' modules share. No torch.

python -c "from sagemaker_lightning.launch.platforms.cluster import names; print(names(3, 1, 'job-worker-0'))"
"""

from collections.abc import Mapping
from dataclasses import dataclass, field

from sagemaker_lightning.failure import UserError

DEFAULT_MASTER_PORT = "29500"  # torch.distributed's own default, where the platform names none
DEFAULT_TIMEOUT_S = 600  # seconds a rank waits for the others (dist_timeout); torch's own default is 30 minutes
# Plan.launcher's value for a process the platform started one per host: Lightning starts one process per device from
# it, or the torchrun of Cluster.torchrun does; the launch line's word
PER_HOST = "process"


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """What a platform's variables say about this process's job."""

    platform: str  # the platform's name, as the launch line says it: "SageMaker", "Kubeflow", "Slurm", ...
    launcher: str  # who started this process: PER_HOST (the platform, one a host), "torchrun", "mpirun" or "srun"
    hosts: tuple[str, ...]  # the job's hosts, by node rank; a host whose name the platform does not say: node-<i>
    node_rank: int  # this host's index in `hosts`
    processes_per_host: int  # training processes on each host
    master_addr: str  # torch.distributed's rendezvous (torchrun's static one too)
    master_port: str
    env: Mapping[str, str | None] = field(default_factory=dict)  # rank variables to set (None: to unset)
    torchrun: tuple[str, ...] = ()  # torchrun's options, when the runtime starts torchrun here (plan.Plan.torchrun)


def whole(env: Mapping[str, str], name: str, least: int = 0) -> int:
    """Variable `name` as a whole number of at least `least`, or one line naming it."""
    raw = env.get(name, "")
    if not (raw.strip().isdigit() and int(raw) >= least):
        raise UserError(
            f"{name}={raw!r} is not a whole number of at least {least}; the platform sets it, check the job"
        )
    return int(raw)


def names(count: int, node_rank: int, hostname: str) -> tuple[str, ...]:
    """The hosts of a platform that names only this one (torchrun assigns node ranks itself)."""
    return tuple(hostname if i == node_rank else f"node-{i}" for i in range(count))


def join_timeout(options: Mapping) -> str:
    """torchrun's option for a c10d rendezvous: it waits for every host as long as a rank waits for the others."""
    return f"--rdzv-conf=join_timeout={options.get('timeout_s', DEFAULT_TIMEOUT_S)}"


def static_torchrun(nnodes: int, node_rank: int, master: str, port: str, per_host: int) -> tuple[str, ...]:
    """torchrun's options for a platform that starts one process per host where the trainer wants several: the
    platform's ranks and master, torchrun's static rendezvous (one process of Lightning's own per device would
    inherit the host's rank variables)."""
    return (
        f"--nnodes={nnodes}",
        f"--node-rank={node_rank}",
        f"--master-addr={master}",
        f"--master-port={port}",
        f"--nproc-per-node={per_host}",
    )

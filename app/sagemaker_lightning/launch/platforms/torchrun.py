"""Already under torchrun (or hyperpodrun, which is torchrun's agent with a rendezvous of its own), on any platform:
torchrun set every rank variable (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR), so
nothing is set here. The platform below it (Kubeflow's PET_*, SLURM_*, none) is named in the launch line. Node ranks
are torchrun's: with a c10d rendezvous, the order the hosts joined in; so only this host's name is known.

    TORCHELASTIC_RUN_ID=x RANK=1 LOCAL_RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=1 GROUP_RANK=1 MASTER_ADDR=a MASTER_PORT=1 \\
        python -c "import os; from sagemaker_lightning.launch.platforms import torchrun; print(torchrun.cluster(os.environ, 'b'))"
"""

from collections.abc import Mapping

from sagemaker_lightning.failure import UserError
from sagemaker_lightning.launch.platforms.cluster import DEFAULT_MASTER_PORT, Cluster, names, whole


def below(env: Mapping[str, str]) -> str:
    """The platform that started torchrun, by its variables."""
    if "PET_NNODES" in env:
        return "Kubeflow"
    if "SLURM_PROCID" in env:
        return "Slurm"
    return "torchrun"


def cluster(env: Mapping[str, str], hostname: str) -> Cluster:
    world, per_host = whole(env, "WORLD_SIZE", 1), whole(env, "LOCAL_WORLD_SIZE", 1)
    if world % per_host:
        raise UserError(
            f"torchrun started {per_host} processes on this host but {world} in all: every host needs the same "
            "--nproc-per-node"
        )
    node_rank = whole(env, "GROUP_RANK") if "GROUP_RANK" in env else whole(env, "RANK") // per_host
    count = world // per_host
    hosts = names(count, node_rank, hostname)
    out = {"PL_TRAINER_NUM_NODES": str(count), "PL_TRAINER_DEVICES": str(per_host)}
    master, port = env.get("MASTER_ADDR", "localhost"), env.get("MASTER_PORT", DEFAULT_MASTER_PORT)
    return Cluster(
        platform=below(env),
        launcher="torchrun",
        hosts=hosts,
        node_rank=node_rank,
        processes_per_host=per_host,
        master_addr=master,
        master_port=port,
        env=out,
    )

"""Any launcher that sets torch's own MASTER_ADDR, RANK and WORLD_SIZE for one process per pod or host, without
LOCAL_RANK: a PyTorchJob without PET_*, a job of a scheduler's own. WORLD_SIZE counts the pods and RANK is this pod's
index; a pod where the trainer wants several processes runs them under torchrun (its static rendezvous, this pod's
rank).

    MASTER_ADDR=job-master-0 RANK=1 WORLD_SIZE=2 \\
        python -c "import os; from sagemaker_lightning.launch.platforms import torch_env; print(torch_env.cluster(os.environ, 1, 'job-worker-0'))"
"""

from collections.abc import Mapping

from sagemaker_lightning.failure import UserError
from sagemaker_lightning.launch.platforms.cluster import (
    DEFAULT_MASTER_PORT,
    PER_HOST,
    Cluster,
    names,
    static_torchrun,
    whole,
)

PLATFORM = "MASTER_ADDR/RANK/WORLD_SIZE"  # the platform's name in the launch line: the variables that made it one


def cluster(env: Mapping[str, str], wanted: int, hostname: str) -> Cluster:
    """MASTER_ADDR, RANK and WORLD_SIZE for one process per pod: WORLD_SIZE counts pods, RANK is this pod's index.
    Several processes on a pod: torchrun starts them (static rendezvous, this pod's rank)."""
    pods, rank = whole(env, "WORLD_SIZE", 1), whole(env, "RANK")
    if rank >= pods:
        raise UserError(f"RANK={rank} is not below WORLD_SIZE={pods}: each pod's RANK is its index among the pods")
    master, port = env["MASTER_ADDR"], env.get("MASTER_PORT") or DEFAULT_MASTER_PORT
    hosts = names(pods, rank, hostname)
    if wanted > 1:
        return Cluster(
            platform=PLATFORM,
            launcher=PER_HOST,
            hosts=hosts,
            node_rank=rank,
            processes_per_host=wanted,
            master_addr=master,
            master_port=port,
            env={},
            torchrun=static_torchrun(pods, rank, master, port, wanted),
        )
    out = {"MASTER_PORT": port, "NODE_RANK": str(rank), "PL_TRAINER_NUM_NODES": str(pods), "PL_TRAINER_DEVICES": "1"}
    return Cluster(
        platform=PLATFORM,
        launcher=PER_HOST,
        hosts=hosts,
        node_rank=rank,
        processes_per_host=1,
        master_addr=master,
        master_port=port,
        env=out,
    )

"""Slurm (HyperPod Slurm too): the tasks srun started. SLURM_NTASKS tasks in all, this one SLURM_PROCID,
SLURM_LOCALID on its node, node SLURM_NODEID of SLURM_JOB_NUM_NODES in SLURM_NODELIST's order; the master is the
first node, its port derived from the job's id as Lightning's SLURMEnvironment derives it (MASTER_PORT wins). One
task per node where the trainer wants several processes: torchrun starts them (static rendezvous). The usual
`srun torchrun ...` is torchrun's (torchrun.py). An interactive allocation (SLURM_JOB_NAME bash or interactive) is no
job, as Lightning has it.

    SLURM_NTASKS=2 SLURM_PROCID=1 SLURM_LOCALID=0 SLURM_NODEID=1 SLURM_JOB_NUM_NODES=2 SLURM_NODELIST='n[1-2]' \\
        SLURM_JOB_ID=4711 python -c "import os; from sagemaker_lightning.launch.platforms import slurm; print(slurm.cluster(os.environ, 1, 'n2'))"
"""

import re
from collections.abc import Mapping

from sagemaker_lightning.failure import UserError
from sagemaker_lightning.launch.platforms.cluster import PER_HOST, Cluster, static_torchrun, whole

INTERACTIVE = ("bash", "interactive")  # SLURM_JOB_NAME of an salloc shell: its processes are no job's tasks
PORT_BASE = 15000  # + the job id's last 4 digits: Lightning's SLURMEnvironment's port, so both agree


def started(env: Mapping[str, str]) -> bool:
    return "SLURM_PROCID" in env and "SLURM_NTASKS" in env and env.get("SLURM_JOB_NAME") not in INTERACTIVE


def expand(nodelist: str) -> list[str]:
    """SLURM_NODELIST's hosts in order: "gpu[01-02,05],cpu1" → gpu01, gpu02, gpu05, cpu1."""
    hosts = []
    for name, ranges in re.findall(r"([^,\[]+)(?:\[([^\]]*)\])?", nodelist):
        if not ranges:
            hosts.append(name)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            hosts += [f"{name}{i:0{len(low)}d}" for i in range(int(low), int(high or low) + 1)]
    return hosts


def cluster(env: Mapping[str, str], wanted: int, hostname: str) -> Cluster:
    tasks, rank = whole(env, "SLURM_NTASKS", 1), whole(env, "SLURM_PROCID")
    count = whole(env, "SLURM_JOB_NUM_NODES" if "SLURM_JOB_NUM_NODES" in env else "SLURM_NNODES", 1)
    try:
        hosts = expand(env.get("SLURM_NODELIST") or env.get("SLURM_JOB_NODELIST") or hostname)
    except ValueError:
        raise UserError(f"SLURM_NODELIST={env.get('SLURM_NODELIST')!r} is not a Slurm host list") from None
    if len(hosts) != count or tasks % count:
        raise UserError(
            f"SLURM_NTASKS={tasks} tasks on {count} nodes ({', '.join(hosts)}): every node needs the same number of "
            "tasks (srun --ntasks-per-node)"
        )
    node_rank, per_host = whole(env, "SLURM_NODEID"), tasks // count
    master = hosts[0]
    job_id = env.get("SLURM_JOB_ID", "")
    port = env.get("MASTER_PORT") or str(PORT_BASE + int(job_id[-4:] if job_id.isdigit() else 0))
    if per_host == 1 and wanted > 1:
        torchrun = static_torchrun(count, node_rank, master, port, wanted)
        return Cluster("Slurm", PER_HOST, tuple(hosts), node_rank, wanted, master, port, {}, torchrun)
    out = {
        "MASTER_ADDR": master,
        "MASTER_PORT": port,
        "RANK": str(rank),
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "NODE_RANK": str(node_rank),
        "WORLD_SIZE": str(tasks),
        "LOCAL_WORLD_SIZE": str(per_host),
        "PL_TRAINER_NUM_NODES": str(count),
        "PL_TRAINER_DEVICES": str(per_host),
    }
    return Cluster("Slurm", "srun", tuple(hosts), node_rank, per_host, master, port, out)

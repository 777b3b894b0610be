"""Kubeflow's training operator: a PyTorchJob (training-operator v1) or a TrainJob (Trainer v2).

PET_* (torchrun's flags as variables: torchrun reads any flag from PET_<FLAG>): every PyTorchJob and TrainJob sets
PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT; an elastic PyTorchJob
PET_RDZV_BACKEND=c10d, PET_RDZV_ENDPOINT, PET_NNODES=min:max and PET_MAX_RESTARTS. The job runs under torchrun, which
the runtime starts with these, and `auto` processes per pod meaning the visible GPUs, or 1 on a CPU (torchrun's own
`auto` there is the host's core count).

A PyTorchJob with a Master replica also sets MASTER_ADDR=<job>-master-0, MASTER_PORT, RANK (the pod's index) and
WORLD_SIZE: pods when nprocPerNode is "auto" (the default), pods × nprocPerNode when it is a number; before v1.7 it
always meant pods (kubeflow/trainer #1790, PR #1840). Without PET_* that form is torch_env.py's.

    PET_NNODES=2 PET_NPROC_PER_NODE=auto PET_NODE_RANK=1 PET_MASTER_ADDR=job-master-0 PET_MASTER_PORT=23456 \\
        python -c "import os; from sagemaker_lightning.launch.platforms import kubeflow; print(kubeflow.pet(os.environ, 1, 'job-worker-0'))"
"""

from collections.abc import Mapping

from sagemaker_lightning.failure import UserError
from sagemaker_lightning.launch.platforms.cluster import PER_HOST, Cluster, join_timeout, names, whole

DEFAULT_PORT = "23456"  # the training operator's pytorchjob-port when a job names none
TERMINATION_GRACE_S = 30  # terminationGracePeriodSeconds' default: SIGTERM, then SIGKILL (Kubernetes, HyperPod EKS)


def nodes(env: Mapping[str, str]) -> int:
    """PET_NNODES: a count, or min:max (elastic): the most hosts the job may have."""
    raw = env.get("PET_NNODES", "")
    parts = raw.split(":")
    if not (1 <= len(parts) <= 2 and all(p.strip().isdigit() and int(p) > 0 for p in parts)):
        raise UserError(
            f"PET_NNODES={raw!r} is neither a count of pods nor min:max; the operator sets it, check the job"
        )
    return int(parts[-1])


def pet(env: Mapping[str, str], wanted: int, hostname: str, **options) -> Cluster:
    """A PyTorchJob or TrainJob: its processes are torchrun's (Cluster.torchrun: the options it is started with)."""
    pods = nodes(env)
    given = env.get("PET_NPROC_PER_NODE", "auto")
    if given != "auto" and not given.isdigit():
        raise UserError(f"PET_NPROC_PER_NODE={given!r} is neither auto nor a number; set nprocPerNode in the job")
    per_host = wanted if given == "auto" else int(given)
    if "WORLD_SIZE" in env:  # what the operator meant: pods, or pods × nprocPerNode (v1.7 on, with a number)
        meant = {pods} if given == "auto" else {pods, pods * per_host}
        if whole(env, "WORLD_SIZE", 1) not in meant:
            raise UserError(
                f"WORLD_SIZE={env['WORLD_SIZE']} disagrees with the job's {pods} pods × {per_host} processes each "
                f"(PET_NNODES={env['PET_NNODES']}, PET_NPROC_PER_NODE={given}): expected "
                f"{' or '.join(map(str, sorted(meant)))}; set the replicas and nprocPerNode together"
            )
    node_rank = whole(env, "PET_NODE_RANK") if "PET_NODE_RANK" in env else 0
    endpoint = env.get("PET_RDZV_ENDPOINT", "")
    master = endpoint.rpartition(":")[0] if endpoint else env.get("PET_MASTER_ADDR", "localhost")
    port = endpoint.rpartition(":")[2] if endpoint else env.get("PET_MASTER_PORT", DEFAULT_PORT)
    torchrun = [f"--nproc-per-node={per_host}"]  # torchrun reads the platform's other PET_* itself
    if options.get("max_restarts") is not None:  # the runtime's setting wins over the job's PET_MAX_RESTARTS
        torchrun.append(f"--max-restarts={options['max_restarts']}")
    if env.get("PET_RDZV_BACKEND", "static") != "static" and "PET_RDZV_CONF" not in env:
        torchrun.append(join_timeout(options))
    hosts = names(pods, node_rank, hostname)
    return Cluster(
        platform="Kubeflow",
        launcher=PER_HOST,
        hosts=hosts,
        node_rank=node_rank,
        processes_per_host=per_host,
        master_addr=master,
        master_port=port,
        env={},
        torchrun=tuple(torchrun),
    )

"""A SageMaker training job's hosts and ranks: SM_HOSTS and SM_CURRENT_HOST (the toolkit and SDK 3.x's driver export
them on every host), and the launcher SageMaker's `distribution` ran:
  process   one process per host (no distribution; SDK 3.x's basic driver: cluster.PER_HOST): ranks from the host
            list, and Lightning starts one process per device; LAUNCHER=torchrun: the runtime's torchrun does instead
  torchrun  torch_distributed, SDK 3.x's Torchrun(): one process per device, ranks from torchrun
  mpirun    pytorchddp, smdistributed, mpi: one process per device, ranks from OMPI_COMM_WORLD_*

    SM_HOSTS='["algo-1","algo-2"]' SM_CURRENT_HOST=algo-2 \\
        python -c "import os; from sagemaker_lightning.launch.platforms import sagemaker; print(sagemaker.cluster(os.environ, 1))"
"""

import json
from collections.abc import Mapping

from sagemaker_lightning.failure import UserError
from sagemaker_lightning.launch.hyperparameters import SMDDP, enabled
from sagemaker_lightning.launch.platforms.cluster import DEFAULT_MASTER_PORT, PER_HOST, Cluster, join_timeout

LAUNCHERS = ("lightning", "torchrun")  # LAUNCHER's values: who starts the processes of a one-process-per-host job
GRACE_S = 120  # StopTrainingJob and spot interruption: SIGTERM to every host's PID 1, then SIGKILL this long after


def started(env: Mapping[str, str]) -> bool:
    """Whether this process runs in a SageMaker training job (the toolkit and SDK 3.x's driver export SM_HOSTS)."""
    return "SM_HOSTS" in env


def job_name(env: Mapping[str, str]) -> str | None:
    """The training job's name, which SageMaker gives every host's environment."""
    return env.get("TRAINING_JOB_NAME") or None


def checked_hosts(names, current, given: str, given_current: str) -> tuple[list[str], int]:
    """The job's hosts and this host's index among them (its node rank), as SageMaker gives them; `given`,
    `given_current`: where they come from, as a failure names them."""
    if not (isinstance(names, list) and names and all(isinstance(h, str) and h for h in names)):
        raise UserError(f'{given} is not a JSON list of host names; expected e.g. ["algo-1","algo-2"]')
    if len(set(names)) != len(names):
        raise UserError(f"{given} names a host twice; each host must appear once")
    if current not in names:
        raise UserError(f"{given_current}={current!r} is not in {given}; set it to one of those hosts")
    return names, names.index(current)


def hosts(env: Mapping[str, str]) -> tuple[list[str], int]:
    """The job's hosts and this host's node rank, from SM_HOSTS and SM_CURRENT_HOST (a training process's)."""
    raw = env.get("SM_HOSTS", "")
    try:
        names = json.loads(raw)
    except ValueError:
        names = None
    return checked_hosts(names, env.get("SM_CURRENT_HOST", ""), f"SM_HOSTS={raw!r}", "SM_CURRENT_HOST")


def resource_hosts(config: Mapping) -> tuple[list[str], int]:
    """The job's hosts and this host's node rank, from resourceconfig.json (PID 1's: before the toolkit exports SM_*)."""
    return checked_hosts(config.get("hosts"), config.get("current_host"), "resourceconfig.json's hosts", "current_host")


def local_mode_threads(env: Mapping[str, str], processes: int) -> dict[str, str]:
    """Local mode ("local", "local_gpu") runs every host's container on this one machine, each seeing all its cores
    (SM_NUM_CPUS): each of the job's `processes` gets its share of them as torch's threads, where the job sets none.
    With every core each, two containers on 2 Intel Xeon cores trained `make demo`'s 28 steps in 67 s against 9.3 s
    (torch 2.14.1): each process's OpenMP threads wait spinning for threads the other's hold off the cores."""
    cpus = int(env.get("SM_NUM_CPUS") or 0)
    if not env.get("SM_CURRENT_INSTANCE_TYPE", "").startswith("local") or not cpus or "OMP_NUM_THREADS" in env:
        return {}
    return {"OMP_NUM_THREADS": str(max(1, cpus // processes))}


def smddp_enabled(env: Mapping[str, str]) -> bool:
    """Whether the job asks for SMDDP (distribution smdistributed.dataparallel: its framework parameter)."""
    return enabled(json.loads(env.get("SM_FRAMEWORK_PARAMS") or "{}"), SMDDP)


def launcher(env: Mapping[str, str]) -> str:
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchrun"
    if "OMPI_COMM_WORLD_RANK" in env:
        return "mpirun"
    return PER_HOST


def torchrun_options(env, names: list[str], master: str, port: str, per_host: int, **options) -> tuple[str, ...]:
    """With LAUNCHER=torchrun in a one-process-per-host job: torchrun starts one process per device with a c10d
    rendezvous on the first host (ranks by join order), and restarts every one of them max_restarts times when one
    fails (in-job recovery: each resumes from last.ckpt). Empty otherwise."""
    chosen = env.get("LAUNCHER", "lightning")
    if chosen not in LAUNCHERS:
        raise UserError(f"LAUNCHER={chosen!r} is not one of {', '.join(LAUNCHERS)}; unset it or pick one of those")
    if chosen == "lightning":
        return ()
    restarts = options.get("max_restarts")
    return (
        f"--nnodes={len(names)}",
        f"--nproc-per-node={per_host}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={master}:{port}",
        f"--rdzv-id={job_name(env) or 'sagemaker-lightning'}",
        f"--max-restarts={restarts or 0}",
        join_timeout(options),
    )


def cluster(env: Mapping[str, str], wanted: int, **options) -> Cluster:
    """The job's cluster; `wanted`: processes per host unless a launcher started them (torchrun, mpirun)."""
    names, node_rank = hosts(env)
    mode = launcher(env)
    per_host = wanted
    if mode == "torchrun":
        per_host = int(env.get("LOCAL_WORLD_SIZE") or 1)
    elif mode == "mpirun":
        per_host = int(env.get("OMPI_COMM_WORLD_LOCAL_SIZE") or 1)
        size = int(env["OMPI_COMM_WORLD_SIZE"])
        if size != len(names) * per_host:
            raise UserError(
                f"mpirun started {size} processes, not {per_host} on each of {len(names)} hosts; "
                "set processes_per_host in the distribution to the same number on every host"
            )
        node_rank = int(env["OMPI_COMM_WORLD_RANK"]) // per_host  # mpirun fills each host's slots in host order
    master = env.get("MASTER_ADDR") or env.get("SM_MASTER_ADDR") or names[0]
    port = env.get("MASTER_PORT") or env.get("SM_MASTER_PORT") or DEFAULT_MASTER_PORT  # the toolkit's, SDK 3.x's
    # Lightning reads these as Trainer defaults: a plain script's Trainer() spans the job without a change
    out = {"PL_TRAINER_NUM_NODES": str(len(names)), "PL_TRAINER_DEVICES": str(per_host)}
    if mode == PER_HOST:
        out.update(
            MASTER_ADDR=master, MASTER_PORT=port, NODE_RANK=str(node_rank), WORLD_SIZE=str(len(names) * per_host)
        )
    elif mode == "mpirun":
        # mpirun exported the first host's SM_CURRENT_HOST to every rank: this one is on host rank // per_host
        out.update(
            MASTER_ADDR=master,
            MASTER_PORT=port,
            RANK=env["OMPI_COMM_WORLD_RANK"],
            WORLD_SIZE=str(len(names) * per_host),
            LOCAL_RANK=env["OMPI_COMM_WORLD_LOCAL_RANK"],
            LOCAL_WORLD_SIZE=str(per_host),
            NODE_RANK=str(node_rank),
            SM_CURRENT_HOST=names[node_rank],
        )
    torchrun = torchrun_options(env, names, master, port, per_host, **options) if mode == PER_HOST else ()
    return Cluster(
        platform="SageMaker",
        launcher=mode,
        hosts=tuple(names),
        node_rank=node_rank,
        processes_per_host=per_host,
        master_addr=master,
        master_port=port,
        env=out,
        torchrun=torchrun,
    )

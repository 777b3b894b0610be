"""Slurm (HyperPod Slurm too): the tasks srun started, or the batch script's own process. SLURM_NTASKS tasks in all,
this one SLURM_PROCID, SLURM_LOCALID on its node, node SLURM_NODEID of SLURM_JOB_NUM_NODES in SLURM_NODELIST's order;
the master is the first node, its port derived from the job's id as Lightning's SLURMEnvironment derives it
(MASTER_PORT wins). One task per node where the trainer wants several processes: torchrun starts them (static
rendezvous). The usual `srun torchrun ...` is torchrun's (torchrun.py).

Which process is a job's (step), read in Slurm's source (src/common/env.c, 2026; slurm.h's step ids):
  - a task srun started: SLURM_STEP_ID is the step's number (srun sets it, SLURM_STEP_NUM_TASKS and SLURM_NTASKS
    with it, in env_array_for_step);
  - the batch script (sbatch's batch step): no SLURM_STEP_ID before Slurm 26.05, SLURM_STEP_ID=-5 from it (the batch
    step's id, 0xfffffffb, printed signed); SLURM_PROCID=0, and SLURM_NTASKS only where tasks were asked for. It is
    one process: a job of one task on one node, or, where more were asked for (`--ntasks-per-node=4` and `python
    train.py` without srun), one line instead of waiting dist_timeout for ranks nobody starts.
Not a job: an interactive shell or step. srun --pty (SLURM_PTY_PORT, SLURM_PTY_WIN_*: `srun --pty zsh`, `salloc
-J dev` then `srun --pty bash`) with one task; salloc's interactive step (SLURM_STEP_ID 4294967290, or -6 from 26.05);
a Jupyter kernel (JPY_PARENT_PID, which jupyter_client gives every kernel it starts); an allocation named bash or
interactive (SLURM_JOB_NAME: Lightning's SLURMEnvironment's own rule, _is_slurm_interactive_mode, kept). Lightning's
rule alone took `salloc -J dev` then `srun --pty bash` for a job. srun started inside such a shell with several tasks
is a job again (its tasks inherit SLURM_PTY_PORT, not the shell's one task).

    SLURM_NTASKS=2 SLURM_PROCID=1 SLURM_LOCALID=0 SLURM_NODEID=1 SLURM_JOB_NUM_NODES=2 SLURM_NODELIST='n[1-2]' \\
        SLURM_JOB_ID=4711 SLURM_STEP_ID=0 SLURM_STEP_NUM_TASKS=2 \\
        python -c "import os; from sagemaker_lightning.launch.platforms import slurm; print(slurm.cluster(os.environ, 1, 'n2'))"
"""

import re
from collections.abc import Mapping

from sagemaker_lightning.failure import UserError
from sagemaker_lightning.launch.platforms.cluster import PER_HOST, Cluster, static_torchrun, whole

INTERACTIVE = ("bash", "interactive")  # SLURM_JOB_NAME of an salloc shell: its processes are no job's tasks
BATCH_STEP = ("4294967291", "-5")  # SLURM_STEP_ID of the batch script (0xfffffffb); unset before Slurm 26.05
LAST_STEP = 0xFFFFFFF0  # the highest number of a step srun starts (slurm.h's SLURM_MAX_NORMAL_STEP_ID)
PORT_BASE = 15000  # + the job id's last 4 digits: Lightning's SLURMEnvironment's port, so both agree


def step(env: Mapping[str, str]) -> str | None:
    """Which of a Slurm job's processes this is: "srun" (a task srun started), "batch" (the batch script's own), or
    None (no job's: an interactive shell or step, a Jupyter kernel, a process outside any step)."""
    if "SLURM_PROCID" not in env or "JPY_PARENT_PID" in env or env.get("SLURM_JOB_NAME") in INTERACTIVE:
        return None
    if "SLURM_PTY_PORT" in env and env.get("SLURM_STEP_NUM_TASKS", "1") == "1":  # a terminal's one task
        return None
    number = env.get("SLURM_STEP_ID")
    if number is None or number in BATCH_STEP:
        return "batch"
    if number.isdigit() and int(number) <= LAST_STEP and "SLURM_NTASKS" in env:
        return "srun"
    return None  # salloc's interactive step (0xfffffffa: 4294967290, or -6), the extern step


def started(env: Mapping[str, str]) -> bool:
    return step(env) is not None


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
    count = whole(env, "SLURM_JOB_NUM_NODES" if "SLURM_JOB_NUM_NODES" in env else "SLURM_NNODES", 1)
    if step(env) == "batch":
        return batch(env, wanted, hostname, count)
    tasks, rank = whole(env, "SLURM_NTASKS", 1), whole(env, "SLURM_PROCID")
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
    master, port = hosts[0], master_port(env)
    if per_host == 1 and wanted > 1:
        torchrun = static_torchrun(count, node_rank, master, port, wanted)
        return Cluster(
            platform="Slurm",
            launcher=PER_HOST,
            hosts=tuple(hosts),
            node_rank=node_rank,
            processes_per_host=wanted,
            master_addr=master,
            master_port=port,
            env={},
            torchrun=torchrun,
        )
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
    return Cluster(
        platform="Slurm",
        launcher="srun",
        hosts=tuple(hosts),
        node_rank=node_rank,
        processes_per_host=per_host,
        master_addr=master,
        master_port=port,
        env=out,
    )


def master_port(env: Mapping[str, str]) -> str:
    job_id = env.get("SLURM_JOB_ID", "")
    return env.get("MASTER_PORT") or str(PORT_BASE + int(job_id[-4:] if job_id.isdigit() else 0))


def batch(env: Mapping[str, str], wanted: int, hostname: str, nodes: int) -> Cluster:
    """The batch script's own process: a job of one host, whose `wanted` processes Lightning starts; one line where
    the job asked for more tasks or nodes than this one process (srun starts one per task)."""
    tasks = whole(env, "SLURM_NTASKS", 1) if "SLURM_NTASKS" in env else 1
    if tasks > 1 or nodes > 1:
        raise UserError(
            f"this is the sbatch script's own process, but the job asked for {tasks} tasks on {nodes} nodes "
            f"(SLURM_NTASKS={env.get('SLURM_NTASKS', '')}, SLURM_JOB_NUM_NODES={nodes}): start the training with srun "
            "in the script (srun python train.py ...), which starts one process per task; without it the others "
            "never start and this one waits for them until dist_timeout"
        )
    port = master_port(env)
    out = {"MASTER_ADDR": hostname, "MASTER_PORT": port, "NODE_RANK": "0", "WORLD_SIZE": str(wanted)}
    out.update(PL_TRAINER_NUM_NODES="1", PL_TRAINER_DEVICES=str(wanted))
    return Cluster(
        platform="Slurm",
        launcher=PER_HOST,
        hosts=(hostname,),
        node_rank=0,
        processes_per_host=wanted,
        master_addr=hostname,
        master_port=port,
        env=out,
    )

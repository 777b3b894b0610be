"""The launch plan: environments → plans, as a table, plus the rules inside (interfaces, EFA, devices, channels)."""

import json

import pytest

from sagemaker_lightning.failure import UserError
from sagemaker_lightning.launch.network import network_env
from sagemaker_lightning.launch.plan import make_plan
from sagemaker_lightning.launch.timeout import dist_timeout
from sagemaker_lightning.parallel import strategy

pytestmark = pytest.mark.unit

HOSTS = {"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-2"}


def plan(env, interfaces=("lo", "eth0"), **settings):
    return make_plan(env, interfaces, **settings)


def mpirun_env(rank, size=4, local_size=2):
    # mpirun exports the first host's environment to every rank: SM_CURRENT_HOST says algo-1 everywhere
    return {
        "SM_HOSTS": '["algo-1","algo-2"]',
        "SM_CURRENT_HOST": "algo-1",
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(size),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(rank % local_size),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
    }


TORCHRUN = {
    **HOSTS,
    "TORCHELASTIC_RUN_ID": "x",
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
}

# name: (environment, trainer settings, (launcher, hosts, node rank, processes per host, world size), variables set)
PLANS = {
    "off SageMaker": ({"PATH": "/bin"}, {}, ("none", ("localhost",), 0, 1, 1), {}),
    "Lightning's own process for local rank 1 (no platform)": ({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "NODE_RANK": "0", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}, {}, ("none", ("localhost",), 0, 1, 1), {}),
    "an interactive Slurm allocation (no job)": ({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NAME": "bash"}, {}, ("none", ("localhost",), 0, 1, 1), {}),
    "one host, CPU": ({"SM_HOSTS": '["algo-1"]', "SM_CURRENT_HOST": "algo-1", "SM_NUM_GPUS": "0"}, {},
                      ("process", ("algo-1",), 0, 1, 1), {"MASTER_ADDR": "algo-1", "NODE_RANK": "0", "WORLD_SIZE": "1"}),
    "two hosts, 4 GPUs each": ({**HOSTS, "SM_NUM_GPUS": "4"}, {}, ("process", ("algo-1", "algo-2"), 1, 4, 8),
                               {"MASTER_ADDR": "algo-1", "MASTER_PORT": "29500", "NODE_RANK": "1", "WORLD_SIZE": "8",
                                "PL_TRAINER_NUM_NODES": "2", "PL_TRAINER_DEVICES": "4"}),
    "GPUs but trainer.accelerator=cpu": ({**HOSTS, "SM_NUM_GPUS": "4"}, {"accelerator": "cpu"},
                                          ("process", ("algo-1", "algo-2"), 1, 1, 2), {"WORLD_SIZE": "2"}),
    "trainer.devices=2 of 8 GPUs": ({**HOSTS, "SM_NUM_GPUS": "8"}, {"devices": 2}, ("process", ("algo-1", "algo-2"), 1, 2, 4), {}),
    "trainer.devices as a list": ({**HOSTS, "SM_NUM_GPUS": "8"}, {"devices": [0, 1, 2]}, ("process", ("algo-1", "algo-2"), 1, 3, 6), {}),
    "trainer.devices=-1 (all)": ({**HOSTS, "SM_NUM_GPUS": "8"}, {"devices": -1}, ("process", ("algo-1", "algo-2"), 1, 8, 16), {}),
    "the PyTorch toolkit's master": ({**HOSTS, "MASTER_ADDR": "algo-1", "MASTER_PORT": "7777"}, {},
                                     ("process", ("algo-1", "algo-2"), 1, 1, 2), {"MASTER_PORT": "7777"}),
    "SDK 3.x's driver": ({**HOSTS, "SM_MASTER_ADDR": "algo-1", "SM_MASTER_PORT": "7777", "SM_NUM_GPUS": "0"}, {},
                         ("process", ("algo-1", "algo-2"), 1, 1, 2), {"MASTER_ADDR": "algo-1", "MASTER_PORT": "7777"}),
    "torchrun": (TORCHRUN, {}, ("torchrun", ("algo-1", "algo-2"), 1, 2, 4), {"PL_TRAINER_DEVICES": "2"}),
    "mpirun, rank 2 of 4": (mpirun_env(2), {}, ("mpirun", ("algo-1", "algo-2"), 1, 2, 4),
                            {"RANK": "2", "LOCAL_RANK": "0", "NODE_RANK": "1", "WORLD_SIZE": "4", "SM_CURRENT_HOST": "algo-2"}),
    "mpirun, rank 1 of 4": (mpirun_env(1), {}, ("mpirun", ("algo-1", "algo-2"), 0, 2, 4),
                            {"RANK": "1", "LOCAL_RANK": "1", "NODE_RANK": "0", "SM_CURRENT_HOST": "algo-1"}),
}  # fmt: skip


HOSTNAME = "this-host"  # make_plan's hostname: this host's name where the platform does not say it


def pytorchjob(rank: int, world_size: str = "2", **extra) -> dict:
    """A PyTorchJob's pod with a Master replica (training-operator v1, nprocPerNode auto): exactly its variables."""
    return {
        "MASTER_ADDR": "pt-master-0", "MASTER_PORT": "23456", "RANK": str(rank), "WORLD_SIZE": world_size,
        "PET_NNODES": "2", "PET_NPROC_PER_NODE": "auto", "PET_NODE_RANK": str(rank), "PET_MASTER_ADDR": "pt-master-0",
        "PET_MASTER_PORT": "23456", "KUBERNETES_PORT": "tcp://10.96.0.1:443", **extra,
    }  # fmt: skip


ELASTIC = {  # an elastic PyTorchJob's worker: no Master replica, c10d on worker 0
    "PET_NNODES": "1:2", "PET_NPROC_PER_NODE": "auto", "PET_NODE_RANK": "1", "PET_RDZV_BACKEND": "c10d",
    "PET_RDZV_ENDPOINT": "el-worker-0:23456", "PET_MAX_RESTARTS": "3", "PET_MASTER_ADDR": "el-worker-0",
    "PET_MASTER_PORT": "23456",
}  # fmt: skip
TRAINJOB = {  # Trainer v2's torch-distributed runtime: these five only, and the command is expected to be torchrun
    "PET_NNODES": "2", "PET_NPROC_PER_NODE": "auto", "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "tj-node-0-0.tj", "PET_MASTER_PORT": "29500",
}  # fmt: skip
SLURM = {  # srun --ntasks-per-node=2 on 2 nodes: task 3 of step 0 (srun's variables, src/common/env.c)
    "SLURM_NTASKS": "4", "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "123456", "SLURM_JOB_NAME": "train", "SLURM_STEP_ID": "0",
    "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NUM_NODES": "2", "SLURM_NNODES": "2", "SLURM_TASKS_PER_NODE": "2(x2)",
}  # fmt: skip
BATCH = {  # sbatch's batch step, the script's own process (no srun): one node, no tasks asked for, Slurm before 26.05
    "SLURM_JOB_ID": "123456", "SLURM_JOB_NAME": "train.sh", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0", "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1", "SLURM_NODELIST": "gpu07",
    "SLURM_JOB_NODELIST": "gpu07", "SLURM_TASKS_PER_NODE": "1", "ENVIRONMENT": "BATCH",
}  # fmt: skip
PTY = {  # srun --pty zsh: an interactive shell, step 0's one task in a terminal
    "SLURM_JOB_ID": "123457", "SLURM_JOB_NAME": "zsh", "SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0", "SLURM_JOB_NUM_NODES": "1", "SLURM_NODELIST": "gpu07", "SLURM_STEP_ID": "0",
    "SLURM_STEP_NUM_TASKS": "1", "SLURM_STEP_NUM_NODES": "1", "SLURM_PTY_PORT": "44152", "SLURM_PTY_WIN_COL": "144",
    "SLURM_PTY_WIN_ROW": "38",
}  # fmt: skip
UNDER_TORCHRUN = {  # what torchrun gives its workers (rank 1 of 2, one per host), on any platform
    "TORCHELASTIC_RUN_ID": "none", "RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1",
    "GROUP_RANK": "1", "MASTER_ADDR": "pt-master-0", "MASTER_PORT": "23456", "TORCHELASTIC_RESTART_COUNT": "0",
}  # fmt: skip

# name: (environment, trainer settings and the GPUs here, (platform, launcher, hosts, node rank, processes per host,
# master), the variables set, torchrun's options when the runtime starts it)
PLATFORMS = {
    "PyTorchJob with a Master, CPU: auto is 1 process": (pytorchjob(1), {},
        ("Kubeflow", "process", ("node-0", HOSTNAME), 1, 1, "pt-master-0:23456"), {}, ["--nproc-per-node=1"]),
    "PyTorchJob on 4 GPUs: auto is the GPUs": (pytorchjob(0), {"gpus": 4},
        ("Kubeflow", "process", (HOSTNAME, "node-1"), 0, 4, "pt-master-0:23456"), {}, ["--nproc-per-node=4"]),
    "PyTorchJob with nprocPerNode 4, WORLD_SIZE of v1.7 on (pods × 4)": (
        pytorchjob(1, "8", PET_NPROC_PER_NODE="4"), {"gpus": 4},
        ("Kubeflow", "process", ("node-0", HOSTNAME), 1, 4, "pt-master-0:23456"), {}, ["--nproc-per-node=4"]),
    "PyTorchJob with nprocPerNode 4, WORLD_SIZE before v1.7 (pods)": (
        pytorchjob(1, "2", PET_NPROC_PER_NODE="4"), {"gpus": 4},
        ("Kubeflow", "process", ("node-0", HOSTNAME), 1, 4, "pt-master-0:23456"), {}, ["--nproc-per-node=4"]),
    "PyTorchJob elastic: c10d, join within dist_timeout, PET_MAX_RESTARTS read by torchrun": (ELASTIC, {"timeout_s": 60},
        ("Kubeflow", "process", ("node-0", HOSTNAME), 1, 1, "el-worker-0:23456"), {},
        ["--nproc-per-node=1", "--rdzv-conf=join_timeout=60"]),
    "PyTorchJob elastic with max_restarts given": (ELASTIC, {"max_restarts": 1, "timeout_s": 60},
        ("Kubeflow", "process", ("node-0", HOSTNAME), 1, 1, "el-worker-0:23456"), {},
        ["--nproc-per-node=1", "--max-restarts=1", "--rdzv-conf=join_timeout=60"]),
    "TrainJob": (TRAINJOB, {}, ("Kubeflow", "process", ("node-0", HOSTNAME), 1, 1, "tj-node-0-0.tj:29500"), {},
        ["--nproc-per-node=1"]),
    "a worker under torchrun, on Kubeflow": ({**TRAINJOB, **UNDER_TORCHRUN}, {},
        ("Kubeflow", "torchrun", ("node-0", HOSTNAME), 1, 1, "pt-master-0:23456"),
        {"PL_TRAINER_NUM_NODES": "2", "PL_TRAINER_DEVICES": "1"}, []),
    "plain torchrun, 2 hosts × 2": ({**UNDER_TORCHRUN, "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4",
                                      "LOCAL_WORLD_SIZE": "2"}, {},
        ("torchrun", "torchrun", ("node-0", HOSTNAME), 1, 2, "pt-master-0:23456"), {"PL_TRAINER_DEVICES": "2"}, []),
    "MASTER_ADDR/RANK/WORLD_SIZE alone: one process per pod": (
        {"MASTER_ADDR": "m", "MASTER_PORT": "7", "RANK": "1", "WORLD_SIZE": "2"}, {},
        ("MASTER_ADDR/RANK/WORLD_SIZE", "process", ("node-0", HOSTNAME), 1, 1, "m:7"),
        {"NODE_RANK": "1", "PL_TRAINER_NUM_NODES": "2"}, []),
    "MASTER_ADDR/RANK/WORLD_SIZE on 2 GPUs: torchrun, static, this pod's rank": (
        {"MASTER_ADDR": "m", "RANK": "1", "WORLD_SIZE": "2"}, {"gpus": 2},
        ("MASTER_ADDR/RANK/WORLD_SIZE", "process", ("node-0", HOSTNAME), 1, 2, "m:29500"), {},
        ["--nnodes=2", "--node-rank=1", "--master-addr=m", "--master-port=29500", "--nproc-per-node=2"]),
    "Slurm, 2 tasks per node": (SLURM, {}, ("Slurm", "srun", ("gpu07", "gpu08"), 1, 2, "gpu07:18456"),
        {"RANK": "3", "LOCAL_RANK": "1", "NODE_RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "gpu07"}, []),
    "Slurm, 1 task per node, 4 GPUs: torchrun": (
        {**SLURM, "SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "0"}, {"gpus": 4},
        ("Slurm", "process", ("gpu07", "gpu08"), 1, 4, "gpu07:18456"), {},
        ["--nnodes=2", "--node-rank=1", "--master-addr=gpu07", "--master-port=18456", "--nproc-per-node=4"]),
    "srun torchrun (Slurm below torchrun)": ({**SLURM, **UNDER_TORCHRUN}, {},
        ("Slurm", "torchrun", ("node-0", HOSTNAME), 1, 1, "pt-master-0:23456"), {}, []),
    "SageMaker under torchrun: SageMaker's hosts": (TORCHRUN, {},
        ("SageMaker", "torchrun", ("algo-1", "algo-2"), 1, 2, "algo-1:29500"), {}, []),
}  # fmt: skip


@pytest.mark.parametrize("name", PLATFORMS)
def test_platforms(name):
    """Each platform's exact variables: what the plan makes of them, and the torchrun it starts where it does."""
    env, settings, (platform, launcher, hosts, node_rank, per_host, master), variables, torchrun = PLATFORMS[name]
    p = plan(env, hostname=HOSTNAME, **settings)
    got = (p.platform, p.launcher, p.hosts, p.node_rank, p.processes_per_host, f"{p.master_addr}:{p.master_port}")
    assert got == (platform, launcher, hosts, node_rank, per_host, master)
    assert {k: p.env.get(k) for k in variables} == variables
    assert list(p.torchrun) == torchrun
    assert p.env.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") == ("1" if torchrun else None)  # a new store each attempt
    assert p.in_job and not p.on_sagemaker or platform == "SageMaker"
    assert (p.checkpoint_dir, p.model_dir, p.channels) == ((None, None, {}) if platform != "SageMaker" else
                                                          (p.checkpoint_dir, p.model_dir, p.channels))  # fmt: skip
    command = strategy.torchrun_command(p, "py", ["train.py"])
    assert command == (["py", "-m", "torch.distributed.run", *torchrun, "train.py"] if torchrun else None)


@pytest.mark.parametrize(
    "env, message",
    [
        (pytorchjob(1, "3"), r"WORLD_SIZE=3 disagrees with the job's 2 pods × 1 processes each \(PET_NNODES=2, "
                             r"PET_NPROC_PER_NODE=auto\): expected 2; set the replicas and nprocPerNode together"),
        (pytorchjob(1, "4", PET_NPROC_PER_NODE="4"), r"WORLD_SIZE=4 disagrees .* expected 2 or 8"),
        (pytorchjob(1, PET_NNODES="two"), r"PET_NNODES='two' is neither a count of pods nor min:max"),
        (pytorchjob(1, PET_NPROC_PER_NODE="gpu"), r"PET_NPROC_PER_NODE='gpu' is neither auto nor a number"),
        ({"MASTER_ADDR": "m", "RANK": "2", "WORLD_SIZE": "2"}, r"RANK=2 is not below WORLD_SIZE=2"),
        ({"MASTER_ADDR": "m", "RANK": "-1", "WORLD_SIZE": "2"}, r"RANK='-1' is not a whole number of at least 0"),
        ({**SLURM, "SLURM_NTASKS": "3"}, r"SLURM_NTASKS=3 tasks on 2 nodes \(gpu07, gpu08\): every node needs the same"),
        ({**UNDER_TORCHRUN, "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "2"}, r"torchrun started 2 processes on this host but 3"),
    ],
)  # fmt: skip
def test_a_platform_s_bad_variables_are_named(env, message):
    with pytest.raises(UserError, match=message):
        plan(env)


# name: a Slurm process that is no job's, exactly its variables (issue 48, item 9)
SLURM_SHELLS = {
    "srun --pty zsh": PTY,
    "salloc -J dev, then srun --pty bash": {**PTY, "SLURM_JOB_NAME": "dev"},
    "salloc's interactive step (LaunchParameters=use_interactive_step)": {
        "SLURM_JOB_ID": "8170820", "SLURM_JOB_NAME": "dev", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0", "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1", "SLURM_NODELIST": "gpu07",
        "SLURM_STEP_ID": "4294967290", "SLURM_STEPID": "4294967290", "SLURM_STEP_NUM_TASKS": "1",
        "SLURM_STEP_NUM_NODES": "1", "SLURM_PTY_PORT": "44152", "SLURM_PTY_WIN_COL": "144", "SLURM_PTY_WIN_ROW": "38",
    },
    "salloc's interactive step, Slurm 26.05 (the step id signed)": {
        "SLURM_JOB_ID": "8170820", "SLURM_JOB_NAME": "dev", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0", "SLURM_JOB_NUM_NODES": "1", "SLURM_NODELIST": "gpu07", "SLURM_STEP_ID": "-6",
        "SLURM_STEP_NUM_TASKS": "1",
    },
    "Jupyter's kernel, the server started by an sbatch script": {**BATCH, "JPY_PARENT_PID": "4242"},
    "Jupyter's kernel, the server started by srun": {**PTY, "SLURM_JOB_NAME": "jupyter", "JPY_PARENT_PID": "4242",
        "SLURM_PTY_PORT": None, "SLURM_PTY_WIN_COL": None, "SLURM_PTY_WIN_ROW": None},
    "salloc's shell on the login node (no step)": {"SLURM_JOB_ID": "123458", "SLURM_JOB_NAME": "dev",
        "SLURM_NTASKS": "4", "SLURM_JOB_NUM_NODES": "1", "SLURM_NODELIST": "gpu07"},
}  # fmt: skip


@pytest.mark.parametrize("name", SLURM_SHELLS)
def test_an_interactive_slurm_shell_or_step_is_no_job(name):
    """Issue 48, item 9: these were taken for Slurm jobs (auto-resume, stop registration, failure handling); only a
    task srun started, the batch script's one task, or a launcher's is one."""
    env = {k: v for k, v in SLURM_SHELLS[name].items() if v is not None}
    p = plan(env, hostname=HOSTNAME)
    assert (p.platform, p.launcher, p.in_job, p.hosts, p.world_size) == ("", "none", False, ("localhost",), 1)


# name: (a Slurm job's process, exactly its variables; the GPUs here; (launcher, hosts, processes per host), variables)
SLURM_JOBS = {
    "sbatch's batch step, one task: the script's python is the job": (BATCH, {},
        ("process", (HOSTNAME,), 1), {"MASTER_ADDR": HOSTNAME, "MASTER_PORT": "18456", "WORLD_SIZE": "1"}),
    "the batch step, Slurm 26.05 (SLURM_STEP_ID=-5), --ntasks=1, 4 GPUs: Lightning starts 4": (
        {**BATCH, "SLURM_STEP_ID": "-5", "SLURM_STEPID": "-5", "SLURM_NTASKS": "1", "SLURM_NPROCS": "1"}, {"gpus": 4},
        ("process", (HOSTNAME,), 4), {"WORLD_SIZE": "4", "PL_TRAINER_DEVICES": "4", "NODE_RANK": "0"}),
    "srun -n 4 inside an interactive shell: its tasks inherit SLURM_PTY_PORT, and are a job": (
        {**SLURM, "SLURM_PTY_PORT": "44152", "SLURM_PTY_WIN_COL": "144", "SLURM_PTY_WIN_ROW": "38"}, {},
        ("srun", ("gpu07", "gpu08"), 2), {"RANK": "3", "WORLD_SIZE": "4"}),
}  # fmt: skip


@pytest.mark.parametrize("name", SLURM_JOBS)
def test_the_batch_steps_one_task_is_a_job(name):
    """Issue 48, item 9: sbatch's batch step with one task is a job of one host (it was none where no task was asked
    for); srun's tasks stay a job wherever they run."""
    env, settings, (launcher, hosts, per_host), variables = SLURM_JOBS[name]
    p = plan(env, hostname=HOSTNAME, **settings)
    assert (p.platform, p.launcher, p.hosts, p.processes_per_host, p.in_job) == (
        "Slurm",
        launcher,
        hosts,
        per_host,
        True,
    )
    assert {k: p.env.get(k) for k in variables} == variables


@pytest.mark.parametrize(
    "env",
    [
        {**BATCH, "SLURM_NTASKS": "4", "SLURM_NPROCS": "4", "SLURM_NTASKS_PER_NODE": "4", "SLURM_TASKS_PER_NODE": "4"},
        {**BATCH, "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2", "SLURM_NODELIST": "gpu[07-08]"},
    ],
    ids=["--ntasks-per-node=4", "--nodes=2"],
)  # fmt: skip
def test_an_sbatch_script_that_starts_one_process_where_tasks_were_asked_for_is_one_line(env):
    """Issue 48, item 9: `python train.py` in an sbatch script of --ntasks-per-node=4 (or two nodes), without srun,
    waited for 3 ranks until dist_timeout; now one line says to start it with srun."""
    with pytest.raises(UserError, match=r"this is the sbatch script's own process, but the job asked for \d tasks on "
                       r"\d nodes .*: start the training with srun in the script") as raised:  # fmt: skip
        plan(env, hostname=HOSTNAME)
    assert "\n" not in str(raised.value)


def test_slurm_host_lists():
    from sagemaker_lightning.launch.platforms.slurm import expand

    assert expand("gpu[01-03,07],cpu1") == ["gpu01", "gpu02", "gpu03", "gpu07", "cpu1"]
    assert expand("n[8-10]") == ["n8", "n9", "n10"]
    assert expand("a,b") == ["a", "b"]


@pytest.mark.parametrize("name", PLANS)
def test_plans(name):
    env, settings, (launcher, hosts, node_rank, per_host, world_size), variables = PLANS[name]
    p = plan(env, **settings)
    assert (p.launcher, p.hosts, p.node_rank, p.processes_per_host, p.world_size) == (
        launcher,
        hosts,
        node_rank,
        per_host,
        world_size,
    )
    assert {k: p.env.get(k) for k in variables} == variables
    if launcher == "torchrun":  # torchrun's own variables stay as torchrun set them
        assert not {"RANK", "WORLD_SIZE", "MASTER_ADDR", "NODE_RANK"} & set(p.env)


@pytest.mark.parametrize(
    "hosts, current, message",
    [
        ("algo-1", "algo-1", "not a JSON list"),
        ('"algo-1"', "algo-1", "not a JSON list"),
        ("[]", "algo-1", "not a JSON list"),
        ('["algo-1", ""]', "algo-1", "not a JSON list"),
        ('["algo-1","algo-1"]', "algo-1", "names a host twice"),
        ('["algo-1","algo-2"]', "algo-3", "SM_CURRENT_HOST='algo-3' is not in SM_HOSTS"),
        ('["algo-1"]', "", "SM_CURRENT_HOST='' is not in SM_HOSTS"),
    ],
)
def test_a_bad_host_list_is_named(hosts, current, message):
    with pytest.raises(UserError, match=message):
        plan({"SM_HOSTS": hosts, "SM_CURRENT_HOST": current})


def test_mpirun_with_uneven_hosts_is_named():
    with pytest.raises(UserError, match="mpirun started 3 processes, not 2 on each of 2 hosts"):
        plan(mpirun_env(0, size=3))


@pytest.mark.parametrize("timeout", [0, -5])
def test_a_timeout_that_is_not_positive_is_named(timeout):
    with pytest.raises(UserError, match=f"dist_timeout={timeout} must be a positive number of seconds"):
        plan(HOSTS, timeout_s=timeout)


def test_the_plan_line_says_it_all():
    line = plan({**HOSTS, "SM_NUM_GPUS": "4"}, timeout_s=60).line()
    assert line == (
        "launch: process on algo-1,algo-2, this is algo-2 (node 1), 4 process(es) per host, world size 8, "
        "master algo-1:29500, backend nccl (GPU) / gloo (CPU), timeout 60 s"
    )


@pytest.mark.parametrize(
    "given, expected_nccl, expected_gloo",
    [
        ({"SM_NETWORK_INTERFACE_NAME": "eth0"}, "eth0", "eth0"),
        ({"SM_NETWORK_INTERFACE_NAME": "ethwe"}, None, None),  # what SDK v3 local mode writes
        # the PyTorch toolkit passes the missing name on: unset it, gloo and NCCL pick an interface
        ({"SM_NETWORK_INTERFACE_NAME": "ethwe", "NCCL_SOCKET_IFNAME": "ethwe"}, None, None),
        ({"SM_NETWORK_INTERFACE_NAME": "eth0", "NCCL_SOCKET_IFNAME": "ethwe"}, "eth0", "eth0"),
        # what the user or the launcher set and what exists here stays
        ({"SM_NETWORK_INTERFACE_NAME": "eth0", "NCCL_SOCKET_IFNAME": "^docker0,lo"}, "^docker0,lo", "eth0"),
        ({"SM_NETWORK_INTERFACE_NAME": "eth0", "NCCL_SOCKET_IFNAME": "eth"}, "eth", "eth0"),  # NCCL: a prefix
        ({"SM_NETWORK_INTERFACE_NAME": "eth0", "GLOO_SOCKET_IFNAME": "lo"}, "eth0", "lo"),
        ({"SM_NETWORK_INTERFACE_NAME": "eth0", "GLOO_SOCKET_IFNAME": "eth"}, "eth0", "eth0"),  # gloo: exact names
        ({"SM_NETWORK_INTERFACE_NAME": "eth0", "NCCL_SOCKET_IFNAME": "=eth"}, "eth0", "eth0"),
    ],
)
def test_interface_rules(given, expected_nccl, expected_gloo):
    env = {**HOSTS, **given}
    resolved = {**{k: v for k, v in env.items() if k.endswith("IFNAME")}, **plan(env).env}
    assert (resolved.get("NCCL_SOCKET_IFNAME"), resolved.get("GLOO_SOCKET_IFNAME")) == (expected_nccl, expected_gloo)


@pytest.mark.parametrize(
    "instance_type, preset, workers, expected",
    [
        ("local", {}, True, {}),
        ("ml.g5.2xlarge", {}, True, {}),  # no EFA
        ("ml.g5.48xlarge", {}, True, {"FI_PROVIDER": "efa", "FI_EFA_USE_HUGE_PAGE": "0"}),
        (
            "ml.p4d.24xlarge",
            {},
            True,
            {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_USE_HUGE_PAGE": "0"},
        ),
        (
            "ml.p4de.24xlarge",
            {},
            True,
            {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_USE_HUGE_PAGE": "0"},
        ),
        ("ml.p5.48xlarge", {}, False, {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1"}),
        ("ml.p5en.48xlarge", {}, False, {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1"}),
        (
            "ml.p6-b200.48xlarge",
            {},
            True,
            {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_USE_HUGE_PAGE": "0"},
        ),
        (
            "ml.trn1.32xlarge",
            {},
            True,
            {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_USE_HUGE_PAGE": "0"},
        ),
        (
            "ml.trn1n.32xlarge",
            {},
            True,
            {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_USE_HUGE_PAGE": "0"},
        ),
        # set by the user or by mpirun's -x: kept
        ("ml.p4d.24xlarge", {"FI_PROVIDER": "tcp", "FI_EFA_USE_HUGE_PAGE": "1"}, True, {"FI_EFA_USE_DEVICE_RDMA": "1"}),
    ],
)
def test_efa_settings_by_instance_type(instance_type, preset, workers, expected):
    env = {**HOSTS, "SM_CURRENT_INSTANCE_TYPE": instance_type, **preset}
    assert {k: v for k, v in network_env(env, ("eth0",), workers).items() if k.startswith("FI_")} == expected


def test_smddp_is_enabled_by_the_framework_parameter():
    assert plan(HOSTS).backend is None
    assert plan({**HOSTS, "SM_FRAMEWORK_PARAMS": '{"sagemaker_mpi_enabled": true}'}).backend is None
    assert (
        plan({**HOSTS, "SM_FRAMEWORK_PARAMS": '{"sagemaker_distributed_dataparallel_enabled": true}'}).backend
        == "smddp"
    )


def sagemaker(tmp="/sm", channels=("training",), **extra):
    env = {**HOSTS, "SM_NUM_GPUS": "0", "SM_CHANNELS": json.dumps(list(channels)), "SAGEMAKER_BASE_DIR": tmp}
    env.update(SM_OUTPUT_DATA_DIR=f"{tmp}/output/data", SM_MODEL_DIR=f"{tmp}/model")
    env.update({f"SM_CHANNEL_{c.upper()}": f"{tmp}/input/data/{c}" for c in channels})
    return {**env, **extra}


def test_settings_put_the_trainer_on_the_job_s_paths():
    assert plan(sagemaker()).settings() == {
        "checkpoint.dirpath": "/sm/checkpoints",
        "model_dir": "/sm/model",
        "trainer.default_root_dir": "/sm/output/data",
        "logger.save_dir": "/sm/output/data/tensorboard",
    }
    assert plan({"PATH": "/bin"}).settings() == {}
    env = sagemaker()
    del env["SAGEMAKER_BASE_DIR"]
    assert plan(env).settings()["checkpoint.dirpath"] == "/opt/ml/checkpoints"


def test_the_data_channel():
    assert plan(sagemaker()).data_dir() == "/sm/input/data/training"
    assert plan(sagemaker(channels=("train", "extra"), DATA_CHANNEL="train")).data_dir() == "/sm/input/data/train"
    assert plan(sagemaker(channels=())).data_dir() is None
    with pytest.raises(UserError, match="no input channel 'training' \\(it has train\\).*DATA_CHANNEL"):
        plan(sagemaker(channels=("train",))).data_dir()
    assert plan(sagemaker(channels=("train",))).data_dir(strict=False) is None  # arguments.parse's first try


def test_torchrun_command():
    p = plan({**HOSTS, "TRAINING_JOB_NAME": "job-1", "SM_NUM_GPUS": "4"}, timeout_s=30)
    assert strategy.torchrun_command(p, "py", ["train.py", "--a", "1"]) is None  # LAUNCHER=lightning: Lightning
    p = plan({**HOSTS, "TRAINING_JOB_NAME": "job-1", "SM_NUM_GPUS": "4", "LAUNCHER": "torchrun"}, timeout_s=30)
    assert strategy.torchrun_command(p, "py", ["train.py"]) == [
        "py", "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=4", "--rdzv-backend=c10d",
        "--rdzv-endpoint=algo-1:29500", "--rdzv-id=job-1", "--max-restarts=0", "--rdzv-conf=join_timeout=30", "train.py",
    ]  # fmt: skip
    restarting = plan({**HOSTS, "LAUNCHER": "torchrun"}, max_restarts=2)  # in-job recovery on SageMaker
    assert "--max-restarts=2" in strategy.torchrun_command(restarting, "py", ["train.py"])
    # under a launcher that already started one process per device, LAUNCHER=torchrun adds nothing
    assert strategy.torchrun_command(plan({**TORCHRUN, "LAUNCHER": "torchrun"}), "py", ["train.py"]) is None
    with pytest.raises(UserError, match="LAUNCHER='deepspeed' is not one of lightning, torchrun"):
        plan({**HOSTS, "LAUNCHER": "deepspeed"})


def test_a_bad_dist_timeout_is_one_line_at_pid_1():
    for given in ("ten", "None", "0", -5, 1.5, True):
        with pytest.raises(UserError, match=r"dist_timeout=.* is not a positive whole number of seconds; e\.g\. 600"):
            dist_timeout({"dist_timeout": given})
    assert dist_timeout({"dist_timeout": "30"}) == dist_timeout({"dist_timeout": 30}) == 30
    # SDK 2.x's Estimator with source_dir JSON-encodes every value; run_sagemaker.py passes words as strings
    assert dist_timeout({"dist_timeout": '"30"'}) == 30
    with pytest.raises(UserError, match="dist_timeout='-3' is not"):
        dist_timeout({"dist_timeout": '"-3"'})
    with pytest.raises(UserError, match=r"dist_timeout=100000000000000 must be .* at most 2419200 \(28 days"):
        dist_timeout({"dist_timeout": "100000000000000"})  # timedelta's range: a traceback before


@pytest.mark.parametrize(
    "instance_type, cpus, preset, per_host, expected",
    [
        ("local", "2", {}, 1, "1"),  # make demo's 2 containers on 2 cores
        ("local", "16", {}, 2, "4"),  # 2 hosts × 2 processes on 16 cores
        ("local", "2", {}, 2, "1"),  # more processes than cores: one thread each, never none
        ("local_gpu", "8", {}, 1, "4"),
        ("local", "2", {"OMP_NUM_THREADS": "2"}, 1, None),  # the job's own (Estimator's environment): kept
        ("local", "", {}, 1, None),  # no core count (PID 1, the toolkit): nothing
        ("local", "0", {}, 1, None),  # nor a count of none
        ("ml.c5.4xlarge", "16", {}, 1, None),  # a host of its own: every core
    ],
)
def test_local_mode_shares_the_machines_cores_among_the_jobs_processes(instance_type, cpus, preset, per_host, expected):
    env = {**HOSTS, "SM_CURRENT_INSTANCE_TYPE": instance_type, "SM_NUM_CPUS": cpus, "SM_NUM_GPUS": "0", **preset}
    plan = make_plan(env, {"eth0"}, devices=per_host)
    assert plan.env.get("OMP_NUM_THREADS") == expected

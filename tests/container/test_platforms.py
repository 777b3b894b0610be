"""The same image where users go after training jobs, in Docker stand-ins: each pod a container on a network of the
test's own, named as the platform names its pods (`<job>-master-0`, `<job>-worker-0`; a TrainJob's
`<job>-node-0-0.<job>` as a network alias), its hostname the pod's, and given exactly the variables that platform
gives (../shared/reference/sagemaker.md section 9). No Kubernetes, Slurm or HyperPod control plane runs here: what
the test does as the platform (start, stop, remove the pods) is said where it does it (docs/platforms.md).

One chain of jobs of world size 2 of the user project (examples/user_project: 12 small steps), every one ending
with the weights of the first, uninterrupted run:
  - a PyTorchJob with a Master (PET_* and MASTER_ADDR/RANK/WORLD_SIZE: the runtime starts torchrun): the reference,
    exported;
  - plain torchrun (static rendezvous) stopped mid-epoch as Kubernetes deletes a pod (`docker stop -t 30`): a
    complete checkpoint; the gang removed and recreated on the same volume (JobSet's restart, HyperPod's
    auto-resume), as a TrainJob: it resumes exactly and ends with the reference's weights;
  - an elastic PyTorchJob (c10d, PET_MAX_RESTARTS=1) whose rank 1 is SIGKILLed mid-epoch: torchrun restarts every
    rank from last.ckpt inside the job, which ends 0 with the reference's weights;
  - Slurm's variables (srun's tasks), a rank stuck at step 2 with the defaults (no training_timeout): both hosts end
    within the floor plus 30 s with the hang line (started first: its two minutes of waiting overlap the others);
  - bad input, one line each: WORLD_SIZE against the pods, a master that never resolves, an unwritable checkpoint
    directory.

    TEST_IMAGE=sagemaker-lightning:mine .venv/bin/pytest tests/container/test_platforms.py
"""

import os
import re
import subprocess
import time
import uuid
from datetime import datetime

import pytest
import torch
from job_lines import final, goodputs

from sagemaker_lightning.health import watchdog

pytestmark = pytest.mark.container

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROJECT = os.path.join(ROOT, "examples", "user_project")
TRAIN = [  # the user project's script (examples/user_project): 12 steps of 16 points a rank, in a second or two
    "python", "train.py", "--data.root", "/data", "--trainer.max_epochs", "1", "--data.batch_size", "16",
    "--seed_everything", "0", "--trainer.accelerator", "cpu", "--last_checkpoint_every_n_steps", "2",
    "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", "/tmp/run",  # the code's folder is read-only
]  # fmt: skip
STEPS = 12  # 384 training points, 192 a rank


class Platform:
    """Pods of this module's jobs: containers on one network; every one removed at the end, with the network."""

    def __init__(self, image: str, data: str, tmp):
        self.image, self.data, self.tmp = image, data, tmp
        self.network = f"platforms-{uuid.uuid4().hex[:8]}"
        self.names: list[str] = []
        subprocess.run(["docker", "network", "create", self.network], check=True, capture_output=True)

    def job(self, kind: str) -> str:
        return f"{kind}{uuid.uuid4().hex[:6]}"  # the job's name: its pods' names start with it

    def start(self, name: str, env: dict, *command: str, mounts: dict | None = None, alias: str | None = None) -> str:
        """A pod: `docker run` of the image (its entrypoint PID 1, as `args:` in a manifest keeps it)."""
        cmd = ["docker", "run", "-d", "--name", name, "--hostname", name, "--network", self.network, "-w", "/code"]
        cmd += ["--network-alias", alias] if alias else []
        for key, value in {**env, "PYTHONPATH": "/plugins"}.items():  # the tests' faults (tests/plugins)
            cmd += ["-e", f"{key}={value}"]
        mounts = {
            "/data": f"{self.data}:ro",
            "/code": f"{PROJECT}:ro",
            "/plugins": f"{ROOT}/tests/plugins:ro",
            **(mounts or {}),
        }
        for target, source in mounts.items():
            source, _, mode = str(source).partition(":")
            cmd += ["-v", f"{source}:{target}" + (f":{mode}" if mode else "")]
        subprocess.run([*cmd, self.image, *command], check=True, capture_output=True)
        self.names.append(name)
        return name

    def folder(self, name: str):
        path = self.tmp / name
        path.mkdir(exist_ok=True)
        os.chmod(path, 0o777)
        return path

    def remove(self, *names: str) -> None:
        subprocess.run(["docker", "rm", "-f", *names], capture_output=True)

    def close(self) -> None:
        self.remove(*self.names)
        subprocess.run(["docker", "network", "rm", self.network], capture_output=True)


def logs(name: str, stamps: bool = False) -> str:
    done = subprocess.run(
        ["docker", "logs", *(["--timestamps"] if stamps else []), name], capture_output=True, text=True
    )
    return done.stdout + done.stderr


def running(name: str) -> bool:
    state = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", name], capture_output=True, text=True)
    return state.stdout.strip() == "true"


def wait_for(name: str, pattern: str, timeout: float = 300) -> re.Match:
    """The first match of `pattern` in pod `name`'s log, as soon as it shows."""
    deadline = time.monotonic() + timeout
    while True:
        if found := re.search(pattern, logs(name)):
            return found
        assert running(name), f"{name} ended without {pattern!r}:\n{logs(name)[-4000:]}"
        assert time.monotonic() < deadline, f"no {pattern!r} in {name} within {timeout} s:\n{logs(name)[-4000:]}"
        time.sleep(1)


def ended(*names: str, timeout: float = 300) -> list[int]:
    """Each pod's exit code, once it ends."""
    codes = []
    for name in names:
        done = subprocess.run(["docker", "wait", name], capture_output=True, text=True, timeout=timeout)
        codes.append(int(done.stdout.strip()))
    return codes


def weights(*names: str) -> tuple[str, int]:
    """The job's final weights and step, from its pods' logs."""
    return final("".join(logs(n) for n in names))


def when(stamp: str) -> float:
    """Docker's RFC 3339 time (nanoseconds, Z) in seconds."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(whole).timestamp() + float(f"0.{fraction or 0}")


def saved_step(ckpts) -> int:
    return torch.load(ckpts / "last.ckpt", map_location="cpu", weights_only=False)["global_step"]


def pytorchjob(job: str, rank: int) -> dict:
    """A PyTorchJob pod's variables with a Master replica (training-operator v1: nprocPerNode auto)."""
    master = f"{job}-master-0"
    return {
        "MASTER_ADDR": master, "MASTER_PORT": "23456", "RANK": str(rank), "WORLD_SIZE": "2", "PET_NNODES": "2",
        "PET_NPROC_PER_NODE": "auto", "PET_NODE_RANK": str(rank), "PET_MASTER_ADDR": master, "PET_MASTER_PORT": "23456",
    }  # fmt: skip


def trainjob(job: str, rank: int) -> dict:
    """A TrainJob pod's variables (Trainer v2's torch-distributed runtime): these five only."""
    return {
        "PET_NNODES": "2", "PET_NPROC_PER_NODE": "auto", "PET_NODE_RANK": str(rank),
        "PET_MASTER_ADDR": f"{job}-node-0-0.{job}", "PET_MASTER_PORT": "29500",
    }  # fmt: skip


def slurm(job: str, rank: int, tasks: int = 2) -> dict:
    """srun's variables for task `rank`, one task per node."""
    return {
        "SLURM_NTASKS": str(tasks), "SLURM_PROCID": str(rank), "SLURM_LOCALID": "0", "SLURM_NODEID": str(rank),
        "SLURM_JOB_NUM_NODES": str(tasks), "SLURM_NNODES": str(tasks), "SLURM_NODELIST": f"{job}-[0-{tasks - 1}]",
        "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train", "SLURM_NTASKS_PER_NODE": "1", "SLURM_STEP_ID": "0",
        "SLURM_STEP_NUM_TASKS": str(tasks),
    }  # fmt: skip


@pytest.fixture(scope="module")
def platform(image, points_dir, tmp_path_factory):
    made = Platform(image, points_dir, tmp_path_factory.mktemp("platforms"))
    yield made
    made.close()


@pytest.fixture(scope="module")
def stuck(platform) -> tuple[str, str]:
    """Slurm's two tasks, rank 1 stuck in Python at the start of step 2 (a deadlock in the project's code), with the
    defaults: started as soon as the module's first test runs."""
    job = platform.job("sl")
    hang = ["--trainer.callbacks+=faults.Hang", "--trainer.callbacks.step=2", "--checkpoint.dirpath", "/tmp/ckpt"]
    return tuple(platform.start(f"{job}-{rank}", slurm(job, rank), *TRAIN, *hang) for rank in (0, 1))


@pytest.fixture(scope="module")
def reference(platform, stuck) -> tuple[str, int]:
    """A PyTorchJob with a Master, uninterrupted: the weights every other job must end with. Its pods run
    `python train.py` (PyTorchJob's usual command): the runtime starts torchrun with the operator's PET_* and one
    process per pod on a CPU (`auto`), where torchrun's own `auto` would start one per core."""
    job, model = platform.job("pt"), platform.folder("pt-model")
    pods = [platform.start(f"{job}-master-0", pytorchjob(job, 0), *TRAIN, "--model_dir", "/model",
                           mounts={"/model": model}),
            platform.start(f"{job}-worker-0", pytorchjob(job, 1), *TRAIN)]  # fmt: skip
    assert ended(*pods) == [0, 0], logs(pods[0])[-3000:] + logs(pods[1])[-3000:]
    master = logs(pods[0])
    assert re.search(
        rf"launch: torchrun \(Kubeflow\) on {job}-master-0,node-1, this is {job}-master-0 \(node 0\), 1 process\(es\) "
        rf"per host, world size 2, master {job}-master-0:23456",
        master,
    ), master[-3000:]
    # no checkpoint.dirpath: the one warning line a restarted pod would make true
    assert master.count("warning: no checkpoint.dirpath: a restarted pod or gang starts over") == 1
    assert len(goodputs(master, logs(pods[1]))) == 1  # the job's end, from global rank 0
    assert {"model.pt", "config.yaml"} <= set(os.listdir(model))
    return weights(*pods)


def test_a_pytorchjob_trains_as_one_job_of_two_and_exports(reference):
    assert reference[1] == STEPS


def test_a_stopped_pod_saves_and_the_recreated_gang_resumes_exactly(platform, reference):
    """Plain torchrun (static rendezvous) on two pods; Kubernetes deletes one mid-epoch (SIGTERM, SIGKILL 30 s
    later): both stop at one step with a complete last.ckpt, the deleted pod within the grace (143, not 137). The gang
    is removed whole and recreated on the same volume (JobSet's restart, HyperPod's auto-resume), here as a TrainJob
    whose command is torchrun: it resumes at that very step and ends with the reference's weights, exported. (A kill
    without a stop, resumed from an earlier last.ckpt: the in-job recovery below.)"""
    ckpts, model = platform.folder("gang-ckpts"), platform.folder("gang-model")
    job = platform.job("tr")
    # every step paced from the first: the stop agreement's interval follows the pace timed at the last agreement, so
    # fast first steps (1 ms) then slow ones made it 100 steps, past the epoch (stop.MOST_STEPS: a pace that drops
    # delays a stop that many steps)
    pace = ["--trainer.callbacks+=faults.Pace", "--trainer.callbacks.step=0", "--trainer.callbacks.seconds=1.5"]
    torchrun = [
        [
            "torchrun", "--nnodes=2", f"--node-rank={rank}", f"--master-addr={job}-0", "--master-port=29500",
            "--nproc-per-node=1", "train.py", *TRAIN[2:], "--checkpoint.dirpath", "/ckpt", *pace,
        ]
        for rank in (0, 1)
    ]  # fmt: skip
    pods = [platform.start(f"{job}-{rank}", {}, *torchrun[rank], mounts={"/ckpt": ckpts}) for rank in (0, 1)]
    wait_for(pods[0], r"saved last\.ckpt at epoch 0 step 2")
    subprocess.run(["docker", "stop", "--time", "30", pods[1]], check=True, capture_output=True)
    codes = ended(*pods)
    output = logs(pods[0]) + logs(pods[1])
    assert codes[1] == 143, output[-4000:]  # ended within the grace, stopped (137: SIGKILLed)
    assert re.search(r"launch: torchrun \(torchrun\) on", output)
    assert "stopped by SIGTERM" in logs(pods[1]) and "entrypoint: SIGTERM: passed on to training processes" in output
    assert "goodput so far" in logs(pods[0])  # rank 0's stop line says where the time went until the stop
    stopped = int(re.findall(r"saved last\.ckpt at epoch 0 step (\d+)", logs(pods[0]))[-1])
    assert 2 < stopped < STEPS and saved_step(ckpts) == stopped, logs(pods[0], True) + logs(pods[1], True)  # whole
    assert not [p for p in os.listdir(ckpts) if p.endswith(".partial")]
    platform.remove(*pods)

    tj = platform.job("tj")
    command = ["torchrun", "--nproc-per-node=1", "train.py", *TRAIN[2:], "--checkpoint.dirpath", "/ckpt"]
    pods = [
        platform.start(f"{tj}-node-0-{r}", trainjob(tj, r), *command, *(["--model_dir", "/model"] if r == 0 else []),
                       mounts={"/ckpt": ckpts, "/model": model}, alias=f"{tj}-node-0-{r}.{tj}")
        for r in (0, 1)
    ]  # fmt: skip
    assert ended(*pods) == [0, 0], logs(pods[0])[-4000:]
    output = logs(pods[0]) + logs(pods[1])
    assert f"resuming at epoch 0 step {stopped} from last.ckpt" in output
    assert not re.search(r"warning: (no )?checkpoint\.dirpath", output)  # a volume that outlives the pods: no warning
    assert re.search(rf"launch: torchrun \(Kubeflow\) on {tj}-node-0-0,node-1", output)
    assert len(goodputs(output)) == 1  # summed across both gangs: the stopped one's time came with the checkpoint
    assert weights(*pods) == reference  # same final step, same weights: an exact resume
    assert {"model.pt", "config.yaml"} <= set(os.listdir(model))


def test_a_crashed_rank_restarts_every_rank_inside_the_job(platform, reference):
    """An elastic PyTorchJob (c10d on worker 0, PET_MAX_RESTARTS=1): rank 1 is SIGKILLed at the start of step 5
    (after last.ckpt at step 4). torchrun restarts every rank, they resume from last.ckpt, and the job ends 0 with the
    reference's weights; the log says which restart, and how the killed process ended."""
    job, ckpts = platform.job("el"), platform.folder("elastic-ckpts")
    elastic = {
        "PET_NNODES": "2:2", "PET_NPROC_PER_NODE": "auto", "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ENDPOINT": f"{job}-worker-0:23456", "PET_MAX_RESTARTS": "1", "PET_MASTER_ADDR": f"{job}-worker-0",
        "PET_MASTER_PORT": "23456",
    }  # fmt: skip
    kill = ["--trainer.callbacks+=faults.KillRank", "--trainer.callbacks.step=5", "--trainer.callbacks.attempt=0"]
    args = [*TRAIN, "--checkpoint.dirpath", "/ckpt", *kill]
    pods = [
        platform.start(f"{job}-worker-{r}", {**elastic, "PET_NODE_RANK": str(r)}, *args, mounts={"/ckpt": ckpts})
        for r in (0, 1)
    ]
    codes = ended(*pods)
    output = logs(pods[0]) + logs(pods[1])
    assert codes == [0, 0], output[-6000:]
    assert "resuming at epoch 0 step 4 from last.ckpt" in output
    assert re.search(r"restart 1 of torchrun's worker group on host \S+ \(TORCHELASTIC_RESTART_COUNT=1\)", output)
    assert "ended without a line (a signal: SIGKILL" in output, output[-6000:]
    assert len(goodputs(output)) == 1  # the killed attempt's record came with last.ckpt and its ledger
    assert weights(*pods) == reference


def test_a_rank_stuck_in_the_first_steps_ends_every_host_with_the_hang_line(stuck, reference):
    """Slurm's tasks (srun: ranks from SLURM_*), the defaults: rank 1 stuck at the start of step 2. Both hosts end
    within the floor (120 s) plus 30 s of it, each with the same line naming rank 1; before, the training timeout was
    dist_timeout (600 s) until 10 steps were timed."""
    codes = ended(*stuck, timeout=600)
    first = logs(stuck[0], stamps=True)
    assert re.search(r"launch: srun \(Slurm\) on sl\w+-0,sl\w+-1, this is sl\w+-0 \(node 0\)", first), first[-3000:]
    assert codes == [1, 1], first[-3000:]
    # a checkpoint directory in the container's own filesystem: the warning, once (a restarted pod would not find it)
    assert first.count("warning: checkpoint.dirpath=/tmp/ckpt is on this container's own filesystem (overlay)") == 1
    line = rf"did not finish within the training timeout of {watchdog.FLOOR_S:g} s \(training_timeout\)"
    for pod in stuck:
        assert re.search(line + r".*rank 1 on sl\w+-1", logs(pod)), logs(pod)[-3000:]
    # on docker's clock: from rank 0's save at step 2 (rank 1 sticks just after it) to each pod's end
    stamped = [line.partition(" ") for line in first.splitlines()]
    (stuck_at,) = [when(stamp) for stamp, _, text in stamped if "saved last.ckpt at epoch 0 step 2" in text]
    finished = subprocess.run(["docker", "inspect", "-f", "{{.State.FinishedAt}}", *stuck], capture_output=True,
                              text=True, check=True).stdout.split()  # fmt: skip
    waited = [when(f) - stuck_at for f in finished]
    assert all(watchdog.FLOOR_S < w < watchdog.FLOOR_S + 30 for w in waited), waited


def test_bad_input_is_one_line_each(platform):
    """Each pod ends 1 with one ERROR line, before it trains: WORLD_SIZE that counts neither the pods nor pods ×
    processes; a master whose name never resolves (dist_timeout=5); a checkpoint directory it cannot write."""
    job = platform.job("bad")
    readonly = platform.folder("readonly")
    pods = {
        "WORLD_SIZE=3 disagrees with the job's 2 pods × 1 processes each": platform.start(
            f"{job}-worker-0", {**pytorchjob(job, 1), "WORLD_SIZE": "3"}, *TRAIN
        ),
        f"cannot resolve the first host '{job}x-master-0' within dist_timeout=5 s": platform.start(
            f"{job}x-worker-0", pytorchjob(f"{job}x", 1), *TRAIN, "--dist_timeout", "5"
        ),
        "checkpoint.dirpath=/ckpt cannot be written (Read-only file system)": platform.start(
            f"{job}-0", slurm(job, 0, tasks=1), *TRAIN, "--checkpoint.dirpath", "/ckpt",
            mounts={"/ckpt": f"{readonly}:ro"},
        ),
    }  # fmt: skip
    for message, pod in pods.items():
        assert ended(pod) == [1]
        errors = [line for line in logs(pod).splitlines() if line.startswith("ERROR: ")]
        assert len(errors) == 1 and errors[0].startswith(f"ERROR: {message}"), logs(pod)[-3000:]
        assert "Traceback" not in logs(pod)

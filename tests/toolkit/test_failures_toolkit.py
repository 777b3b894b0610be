"""Bad input and failing hosts under the real `train` entry point (sagemaker-training) on a temporary /opt/ml: each
ends every host in time, in one line that names the cause: a host list, a channel or a setting that cannot work, a
host that never joins, a rank that dies or hangs, a local rank killed for memory. The bad-input rows whose line the
runtime alone makes run its LightningCLI in this process, as the toolkit would start it (conftest.run_in_process);
PID 1's rows, and a few of the runtime's for the way through the toolkit into the failure file, run as jobs.

    .venv/bin/pytest tests/toolkit/test_failures_toolkit.py
"""

import os
import pickle
import re
import sys

import pytest

from sagemaker_lightning import lines
from sagemaker_lightning.health import stragglers

pytestmark = pytest.mark.toolkit

PLUGINS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plugins")


CASES = {  # case: (hosts, current host, hyperparameters, channels, environment, expected failure line)
    # the toolkit itself rejects a host list that is not a list; these it passes on as SM_HOSTS
    "a host named twice": (["localhost", "localhost"], "localhost", {}, "archive", {}, "names a host twice"),
    "an empty host name": (["localhost", ""], "localhost", {}, "archive", {}, "is not a JSON list of host names"),
    "current host not in the list": (
        ["localhost"],
        "algo-9",
        {},
        "archive",
        {},
        "current_host='algo-9' is not in resourceconfig.json's hosts",  # PID 1's check, before the toolkit's
    ),
    "unresolvable first host": (
        ["no-such-host.invalid", "localhost"],
        "localhost",
        {"dist_timeout": 2},
        "archive",
        {},
        "host no-such-host.invalid did not come up within dist_timeout=2 s",
    ),
    "dist_timeout that is not a number, at PID 1": (
        ["localhost"],
        "localhost",
        {"dist_timeout": "ten"},
        "archive",
        {},
        "dist_timeout='ten' is not a positive whole number of seconds; e.g. 600",
    ),
    "no training channel": (
        ["localhost"],
        "localhost",
        {},
        "other",
        {},
        "the job has no input channel 'training' (it has other)",
    ),
    "empty training channel": (["localhost"], "localhost", {}, "empty", {}, "no CIFAR-10 data in /"),
    "corrupt training channel": (
        ["localhost"],
        "localhost",
        {},
        "corrupt",
        {},
        "cifar-10-python.tar.gz is not a readable tar.gz",
    ),
    "unknown hyperparameter": (
        ["localhost"],
        "localhost",
        {"trainer.max_epochz": 1},
        "archive",
        {},
        "unrecognized arguments: --trainer.max_epochz=1",
    ),
    "wrong type": (
        ["localhost"],
        "localhost",
        {"data.batch_size": "abc"},
        "archive",
        {},
        "data.batch_size=abc is not valid (expected int)",
    ),
    "a list where a number goes": (
        ["localhost"],
        "localhost",
        {"data.batch_size": [32, 64]},
        "archive",
        {},
        "data.batch_size=[32, 64] is not valid (expected int)",
    ),
    "a dict where a number goes": (
        ["localhost"],
        "localhost",
        {"data.batch_size": {"per_gpu": 32}},
        "archive",
        {},
        "data.batch_size={'per_gpu': 32} is not valid (expected int)",
    ),
    "unknown model": (
        ["localhost"],
        "localhost",
        {"model.arch": "resnet1000"},
        "archive",
        {},
        "model.arch='resnet1000' is not a torchvision classification model",
    ),
    "accelerator=gpu without a GPU": (
        ["localhost"],
        "localhost",
        {"trainer.accelerator": "gpu"},
        "archive",
        {},
        "trainer.accelerator=gpu asks for a GPU but this instance has none",
    ),
    "world size mismatch": (
        ["localhost"],
        "localhost",
        {"trainer.num_nodes": 3},
        "archive",
        {},
        "trainer.num_nodes=3 but the job has 1 hosts",
    ),
    "unwritable model directory": (
        ["localhost"],
        "localhost",
        {"model_dir": "/proc/sagemaker-lightning"},
        "archive",
        {},
        "model_dir=/proc/sagemaker-lightning cannot be written",
    ),
    "labels beyond num_classes": (
        ["localhost"],
        "localhost",
        {"data.num_classes": 5},
        "archive",
        {},
        "must lie in 0..4",
    ),
    "unknown launcher": (
        ["localhost"],
        "localhost",
        {},
        "archive",
        {"LAUNCHER": "deepspeed"},
        "LAUNCHER='deepspeed' is not one of lightning, torchrun",
    ),
    "validation split too large": (
        ["localhost"],
        "localhost",
        {"data.val_split": 1000},
        "archive",
        {},
        "data.val_split=1000 leaves no training images",
    ),
}


# The rows run as a job: those whose line PID 1 makes (before the toolkit starts: no torch, a second or two each) and
# a few whose line the runtime makes, through the real toolkit into the failure file (the toolkit's rendering of an
# unknown key, of a dict, a channel's data). Every other row's line is the runtime's alone: its LightningCLI in this
# process, given the environment and arguments the toolkit would give it, is held to the same assertions.
AS_A_JOB = {
    "a host named twice",
    "an empty host name",
    "current host not in the list",
    "unresolvable first host",
    "dist_timeout that is not a number, at PID 1",
    "unknown hyperparameter",
    "a dict where a number goes",
    "corrupt training channel",
}
# and of those, these two with no output folder, as a bare `docker run` gives them (SageMaker mounts one): PID 1 makes
# it; without it the toolkit's failure exited 0 and no failure file was written
NO_OUTPUT_FOLDER = {"a host named twice", "unknown hyperparameter"}


@pytest.mark.parametrize("case", CASES)
def test_bad_input_fails_fast_in_one_line(run_hosts, run_in_process, archive_dir, corrupt_dir, tiny, tiny_job, case):
    hosts, current, hyperparameters, channels, env, message = CASES[case]
    channels = {
        "archive": {"training": archive_dir},
        "other": {"other": archive_dir},
        "empty": {"training": None},
        "corrupt": {"training": corrupt_dir},
    }[channels]
    # SM_STUDIO_LOCAL_MODE skips the toolkit's wait for every host name to resolve (up to 15 minutes)
    env = {"SM_STUDIO_LOCAL_MODE": "true", **env}
    run = run_hosts if case in AS_A_JOB else run_in_process
    bare = {"output": False} if case in NO_OUTPUT_FOLDER else {}
    (host,) = run(hosts, {**tiny, **hyperparameters}, channels, current_hosts=[current], env=env, **bare)
    assert host.returncode != 0
    assert host.seconds < 2 * tiny_job.seconds, f"{case}: {host.seconds:.0f} s, a tiny job {tiny_job.seconds:.0f} s"
    assert host.failure is not None and host.failure.count("\n") == 1 and message in host.failure, host.failure
    assert f"ERROR: {host.failure.strip()}" in host.output  # the same line on stderr
    assert "Traceback" not in host.output
    assert os.listdir(host.path("model")) == []


def test_a_host_that_never_joins_fails_the_job_in_time(run_hosts, archive_dir, tiny, tiny_job):
    """Host 127.0.0.1 never starts training: the first host gives up after dist_timeout (5 s: the wait is what is
    proved, not its default), naming it."""
    (first,) = run_hosts(
        ["localhost", "127.0.0.1"], {**tiny, "dist_timeout": 5}, {"training": archive_dir}, current_hosts=["localhost"]
    )
    assert first.returncode != 0 and first.seconds < 5 + 2 * tiny_job.seconds, first.output[-3000:]
    assert re.search(
        r"only 1 of 2 processes joined within [56] s: the other hosts \(127\.0\.0\.1\) did not start", first.failure
    )
    assert os.listdir(first.path("model")) == []


def test_a_rank_that_dies_fails_the_others_in_time(run_hosts, archive_dir, tiny):
    """Rank 1 is SIGKILLed at step 2 (as the OOM killer does): both hosts fail, each naming its cause."""
    hps = {**tiny, "trainer.limit_train_batches": 5, "dist_timeout": 30, "trainer.callbacks+": "faults.KillRank"}
    first, second = run_hosts(["localhost", "127.0.0.1"], hps, {"training": archive_dir}, env={"PYTHONPATH": PLUGINS})
    assert first.returncode != 0 and second.returncode != 0
    assert abs(first.seconds - second.seconds) < 30  # the first host ends within dist_timeout of the second
    assert "killed with SIGKILL, most often by the kernel's out-of-memory killer" in second.failure
    assert "127.0.0.1" in first.failure, first.failure  # the host to look at
    assert os.listdir(first.path("model")) == [] and os.listdir(second.path("model")) == []


def test_a_straggler_shows_then_its_hang_is_named_with_its_stack(run_hosts, archive_dir, tiny, tiny_job):
    """Rank 1's steps take 2 s longer (a straggler): the progress lines name its host, and a warning says so; then
    it sleeps at the start of step 5 (a deadlock in the project's code) while rank 0 waits in a collective:
    both hosts end within the training timeout, not dist_timeout, with the same line naming the collective, rank 1,
    its host and the function it is stuck in; rank 0's flight recorder dump is in the job's output."""
    faults = [
        {"class_path": "faults.Pace", "init_args": {"rank": 1, "seconds": 2.0}},
        {"class_path": "faults.Hang", "init_args": {"rank": 1, "step": 5}},
    ]
    hps = {**tiny, "trainer.max_epochs": 3, "trainer.limit_train_batches": 5, "trainer.log_every_n_steps": 1,
           "training_timeout": 10, "trainer.callbacks+": faults}  # fmt: skip
    first, second = run_hosts(["localhost", "127.0.0.1"], hps, {"training": archive_dir}, env={"PYTHONPATH": PLUGINS})
    assert first.returncode == second.returncode == 1, first.output[-3000:] + second.output[-3000:]
    ratios = [float(r) for r in re.findall(lines.METRICS["hosts:slowest_ratio"], first.output)]
    assert ratios and ratios[-1] > stragglers.SLOW, first.output[-3000:]  # (2 s + a step) / a step
    assert re.search(
        r"hosts: slowest 127\.0\.0\.1 [\d.]+x the median\n(?!.*hosts: slowest localhost)", first.output, re.S
    )
    assert "warning: host 127.0.0.1 is a straggler" in first.output
    assert first.output.count("ERROR: ") == 1  # the watchdog's line only: the lost peer after it is no second cause
    said = (
        r"gloo:\w+ #\d+ of process group default_pg did not finish within the training timeout of 10 s "
        r"\(training_timeout\) on rank 0 \(localhost, step 5\); rank 1 on 127\.0\.0\.1 did not arrive: in "
        r"on_train_batch_start \(faults\.py:\d+\) < .* at step 5, last entered #\d+$"
    )
    line, goodput = first.failure.rstrip("\n").split("; goodput so far ", 1)  # rank 0's line ends with the goodput
    assert re.match(said, line) and line == second.failure.rstrip("\n"), first.failure + second.failure
    assert re.match(r"[\d.]+ %: training", goodput), goodput
    # the hang comes after the start of two hosts (about twice a one-host tiny job here) and 5 paced steps; 600 s
    # (dist_timeout) not waited out
    assert max(first.seconds, second.seconds) < 2 * tiny_job.seconds + 5 * 2 + 10 + 30
    with open(first.path("output", "data", "flight_recorder", "rank_0"), "rb") as f:
        dump = pickle.load(f)  # torchfrtrace's input: the collective rank 0 waited in, unfinished
    assert any(not e["retired"] for e in dump["entries"]), dump["entries"][-3:]


VENV_BIN = os.path.dirname(sys.executable)  # torchrun, as the toolkit runs it (found on PATH)
LOCAL_RANKS = {  # launcher: (hyperparameters, environment) for 2 processes on one host
    "Lightning's process launcher": ({"trainer.devices": 2, "trainer.accelerator": "cpu"}, {}),
    "torchrun (torch_distributed)": (
        {
            "trainer.devices": 2,
            "trainer.accelerator": "cpu",
            "sagemaker_torch_distributed_enabled": True,  # what SDK 2.x's PyTorch estimator sets
            "sagemaker_instance_type": "ml.c5.xlarge",
            "sagemaker_mpi_num_of_processes_per_host": 2,  # torchrun's --nproc_per_node on a CPU instance
        },
        {"SAGEMAKER_TRAINING_MODULE": "sagemaker_lightning.boot.toolkit:main"},  # the image's
    ),
}


@pytest.mark.parametrize("launcher", LOCAL_RANKS)
def test_a_local_rank_killed_for_memory_is_named(run_hosts, archive_dir, tiny, tiny_job, launcher):
    """Local rank 1 SIGKILLed (as the out-of-memory killer does) while rank 0 waits for it in a collective: the
    failure line names rank 1, its host and the fix, not rank 0's lost peer."""
    hps, env = LOCAL_RANKS[launcher]
    hps = {**tiny, **hps, "trainer.limit_train_batches": 4, "dist_timeout": 30, "trainer.callbacks+": "faults.KillRank"}
    env = {**env, "PYTHONPATH": PLUGINS, "PATH": f"{VENV_BIN}:{os.environ['PATH']}"}
    (host,) = run_hosts(["localhost"], hps, {"training": archive_dir}, env=env)
    assert host.returncode != 0 and host.seconds < 30 + 2 * tiny_job.seconds  # dist_timeout, a tiny job's start
    line = (
        "training process rank 1 (local rank 1) on host localhost was killed with SIGKILL, most often by the "
        "kernel's out-of-memory killer; lower data.batch_size"
    )
    assert host.failure is not None and host.failure.startswith(line), (host.failure, host.output[-3000:])
    assert host.failure.count("\n") == 1
    assert "pre-flight: 1 host × 2 processes; all-reduce busbw" in host.output  # pre-flight under either launcher

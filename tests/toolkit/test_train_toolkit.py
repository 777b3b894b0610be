"""The real `train` entry point (sagemaker-training) runs launch.py → train.py on a temporary /opt/ml."""

import glob
import os
import re
import sys

import pytest

from model import ImageClassifier

pytestmark = pytest.mark.toolkit


def ranks(output: str) -> dict[int, str]:
    """{global rank: final weights digest} from the trainer's `rank R/W host H: weights D` lines."""
    return {int(r): d for r, d in re.findall(r"^rank (\d+)/\d+ host \S+: weights (\w+)$", output, re.M)}


def test_one_host_trains_and_exports(run_hosts, archive_dir, tiny):
    (host,) = run_hosts(["localhost"], tiny, {"training": archive_dir})
    assert host.returncode == 0, host.output
    assert "rank 0/1 host localhost: node_rank 0 local_rank 0" in host.output
    assert sorted(os.listdir(host.path("model"))) == ["config.yaml", "model.pt"]
    ImageClassifier.from_model_dir(host.path("model"))  # loads into the model
    assert os.path.isfile(host.path("checkpoints", "last.ckpt"))
    assert glob.glob(host.path("output", "data", "tensorboard", "*", "version_0", "events.out.tfevents.*"))
    assert os.path.exists(host.path("output", "success")) and host.failure is None


def test_two_hosts_train_as_one_job(run_hosts, archive_dir, tiny):
    """Two toolkit processes as two SageMaker hosts on this machine: one DDP job of world size 2."""
    first, second = run_hosts(["localhost", "127.0.0.1"], {**tiny, "scale_lr_by_world_size": "True"}, {"training": archive_dir})
    assert first.returncode == second.returncode == 0, first.output + second.output
    assert 'launch: process on ["localhost","127.0.0.1"], this is localhost, world size 2' in first.output
    assert "learning rate × world size 2 (linear scaling): 0.1" in first.output  # trainer.yaml's 0.05 × 2
    assert "rank 0/2 host localhost: node_rank 0" in first.output
    assert "rank 1/2 host 127.0.0.1: node_rank 1" in second.output
    digests = {**ranks(first.output), **ranks(second.output)}
    assert sorted(digests) == [0, 1] and digests[0] == digests[1]  # DDP kept the weights in sync
    assert sorted(os.listdir(first.path("model"))) == ["config.yaml", "model.pt"]
    assert os.listdir(second.path("model")) == []  # only global rank 0 writes the model


@pytest.mark.parametrize(
    "case, hosts, current, hyperparameters, channels, message",
    [
        # the toolkit itself rejects a host list that is not a list; these it passes on as SM_HOSTS
        ("a host named twice", ["localhost", "localhost"], "localhost", {}, "archive", "names a host twice"),
        ("an empty host name", ["localhost", ""], "localhost", {}, "archive", "is not a JSON list of host names"),
        ("current host not in the list", ["localhost"], "algo-9", {}, "archive", "SM_CURRENT_HOST='algo-9' is not in SM_HOSTS"),
        ("no training channel", ["localhost"], "localhost", {}, "other", "the job has no input channel 'training' (it has other)"),
        ("empty training channel", ["localhost"], "localhost", {}, "empty", "no CIFAR-10 data in /"),
        ("unknown hyperparameter", ["localhost"], "localhost", {"trainer.max_epochz": 1}, "archive", "unrecognized arguments: --trainer.max_epochz 1"),
        ("ill-typed hyperparameter", ["localhost"], "localhost", {"data.batch_size": "abc"}, "archive", "data.batch_size=abc is not valid (expected int)"),
    ],
)
def test_bad_input_fails_fast_in_one_line(run_hosts, archive_dir, tiny, case, hosts, current, hyperparameters, channels, message):
    channels = {"archive": {"training": archive_dir}, "other": {"other": archive_dir}, "empty": {"training": None}}[channels]
    # SM_STUDIO_LOCAL_MODE skips the toolkit's wait for every host name to resolve (up to 15 minutes)
    (host,) = run_hosts(hosts, {**tiny, **hyperparameters}, channels, current_hosts=[current], env={"SM_STUDIO_LOCAL_MODE": "true"})
    assert host.returncode != 0
    assert host.seconds < 60, f"{case}: took {host.seconds:.0f} s"
    assert host.failure is not None and host.failure.count("\n") == 1 and message in host.failure, host.failure
    assert f"ERROR: {host.failure.strip()}" in host.output  # the same line on stderr
    assert os.listdir(host.path("model")) == []


STANDIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "smddp_standin")
SMDDP = {"sagemaker_distributed_dataparallel_enabled": "true", "trainer.devices": "2", "trainer.accelerator": "cpu"}


def test_smddp_job_never_averages_through_the_backend(run_hosts, archive_dir, tiny):
    """Two processes on the "smddp" backend (a stand-in that refuses ReduceOp.AVG as SMDDP does)."""
    (host,) = run_hosts(["localhost"], {**tiny, **SMDDP}, {"training": archive_dir}, env={"PYTHONPATH": STANDIN})
    assert host.returncode == 0, host.output[-3000:]
    assert "distributed_backend=smddp" in host.output
    digests = ranks(host.output)
    assert sorted(digests) == [0, 1] and digests[0] == digests[1]


def test_the_smddp_standin_catches_averaging(run_hosts, archive_dir, tiny):
    """The control: a callback that logs with sync_dist=True (a mean, ReduceOp.AVG) makes the same job fail."""
    hps = {**tiny, **SMDDP, "trainer.callbacks+": "averaging.LogMeanLoss"}
    (host,) = run_hosts(["localhost"], hps, {"training": archive_dir}, env={"PYTHONPATH": STANDIN})
    assert host.returncode != 0 and "ReduceOp.AVG is not supported" in host.output


def test_smddp_without_the_library_is_named(run_hosts, archive_dir, tiny):
    (host,) = run_hosts(["localhost"], {**tiny, **SMDDP}, {"training": archive_dir})
    assert host.returncode != 0
    assert "the job enables SMDDP (smdistributed dataparallel) but this image has no smdistributed" in host.failure

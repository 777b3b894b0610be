"""The image in SageMaker local mode: the real SDK (2.x Estimator, 3.x ModelTrainer) starts containers with
docker compose, and the toolkit in the image starts the training processes the way the distribution says."""

import os
import re
import tarfile

import pytest
from compose_jobs import job_code
from job_lines import ranks

from model import ImageClassifier
from sagemaker_lightning.lines import METRICS

pytestmark = pytest.mark.container

TINY = [
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=2",
    "trainer.limit_val_batches=1",
    "trainer.accelerator=cpu",
    "trainer.enable_progress_bar=False",
    "data.batch_size=16",
]


def model_tar(output: str) -> str:
    (path,) = re.findall(r"^model\.tar\.gz: (\S+)$", output, re.M)
    return path


def loads(tar_path, tmp_path) -> None:
    with tarfile.open(tar_path) as tar:
        assert sorted(tar.getnames()) == ["config.yaml", "model.pt"]
        tar.extractall(tmp_path / "model")
    ImageClassifier.from_model_dir(str(tmp_path / "model"))


def test_one_instance(local_job, archive_dir, tmp_path):
    """Also: AWS credentials (local mode copies them into the containers) appear nowhere in the job's logs, and the job
    leaves nothing in the temp dir."""
    secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYsagemakerLIGHTNING"
    credentials = {
        "AWS_ACCESS_KEY_ID": "AKIASAGEMAKERLIGHTNG",
        "AWS_SECRET_ACCESS_KEY": secret,
    }  # long-lived: copied in
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    code, output, runs = local_job(1, archive_dir, *TINY, env={**credentials, "TMPDIR": str(scratch)})
    assert code == 0, output[-5000:]
    assert os.listdir(scratch) == []  # the SDK's container root, a copy of the model in it, removed with the job
    assert not any(value in output for value in credentials.values())
    assert [closed.world for closed in ranks(output).values()] == [1]
    tar_path = model_tar(output)
    assert tar_path.startswith(str(runs)) and "/lightning-" in tar_path  # the job's own folder under --output
    loads(tar_path, tmp_path)


MODES = {  # name: (SDK, run_sagemaker.py options)
    "v2, one process per host": ("v2", []),
    "v3, one process per host": ("v3", []),  # v3 names a network interface ("ethwe") the container lacks
    "v2, LAUNCHER=torchrun (c10d), a rank killed and restarted in the job": ("v2", ["--launcher", "torchrun"]),
    "v3, torch_distributed (the toolkit's torchrun)": ("v3", ["--distribution", "torch_distributed"]),
    "v2, mpi (mpirun over ssh)": ("v2", ["--distribution", "mpi"]),
    # the toolkit hands mpirun the interface v3 names ("ethwe"): the image's entrypoint repairs it first
    "v3, mpi (mpirun over ssh)": ("v3", ["--distribution", "mpi"]),
    "v2, pytorchddp (mpirun, SMDataParallel runner)": ("v2", ["--distribution", "pytorchddp"]),
}


# in-job recovery (LAUNCHER=torchrun, max_restarts): rank 1 SIGKILLed in torchrun's first attempt, after last.ckpt
# at step 1, in a checkpoint directory both hosts read (--checkpoints: one folder here; s3:// or FSx in the cloud)
RECOVERY = ["max_restarts=1", "last_checkpoint_every_n_steps=1", "trainer.callbacks+=faults.KillRank",
            "trainer.callbacks.step=1", "trainer.callbacks.attempt=0"]  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
def test_two_instances_train_one_model(local_job, archive_dir, tmp_path, mode):
    sdk, options = MODES[mode]
    if "restarted" in mode:
        options = [*options, "--checkpoints", str(tmp_path / "ckpts"), "--source-dir", job_code(tmp_path),
                   "--entry-point", "train.py", *RECOVERY]  # fmt: skip
    code, output, _ = local_job(2, archive_dir, *options, *TINY, sdk=sdk)
    assert code == 0, output[-5000:]
    if "restarted" in mode:  # every rank restarted from last.ckpt inside the job, the log says which restart
        assert "resuming at epoch 0 step 1 from last.ckpt" in output, output[-5000:]
        assert re.search(
            r"restart 1 of torchrun's worker group on host algo-\S+ \(TORCHELASTIC_RESTART_COUNT=1\)", output
        ), "\n".join(line for line in output.splitlines() if "restart" in line or "ERROR" in line)
    found = ranks(output)
    assert sorted(found) == [0, 1], output[-5000:]
    hosts = sorted(closed.host for closed in found.values())
    assert re.match(r"algo-1\b", hosts[0]) and re.match(r"algo-2\b", hosts[1])  # one rank on each host
    assert {closed.world for closed in found.values()} == {2}
    assert found[0].digest == found[1].digest  # the same final weights on both hosts
    # both hosts on this machine: each process its share of the cores (launch/platforms/sagemaker.py), as rank 0 says
    assert f"devices: cpu with {max(1, os.cpu_count() // 2)} thread(s)," in output, output[-5000:]
    # a tuner reads every host's log: one objective value an epoch (TINY: 1 epoch), from global rank 0 alone
    assert len(re.findall(METRICS["validation:accuracy"], output)) == 1, output[-5000:]
    loads(model_tar(output), tmp_path)


def test_mpirun_two_processes_on_one_host(local_job, archive_dir, tmp_path):
    code, output, _ = local_job(1, archive_dir, "--distribution", "mpi", "--processes-per-host", "2", *TINY)
    assert code == 0, output[-5000:]
    found = ranks(output)
    assert sorted(found) == [0, 1] and {closed.world for closed in found.values()} == {2}
    assert found[0].digest == found[1].digest
    assert "[1,mpirank:1," in output  # started by mpirun, not by Lightning

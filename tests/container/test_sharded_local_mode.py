"""trainer.strategy=fsdp in the real image, SageMaker local mode, two hosts on CPU (gloo), MobileNet-V3-Small (1.5 M
parameters, BatchNorm, 11 blocks: what is proved here is the sharded saves, stops and resumes, not a model's size;
ConvNeXt-T took 1.6 times as long). Four jobs serve every check: ranks, world size and the same consolidated
weights on both hosts, a model.pt that the plain model loads; every container SIGKILLed mid-epoch, restarted: it
resumes at its last save, then docker stop (SIGTERM, as StopTrainingJob and spot) writes the sharded checkpoint well
inside SageMaker's 120 s; restarted again, it ends with the uninterrupted run's weights.

Run: REQUIRE_ALL_TIERS=1 .venv/bin/pytest tests/container/test_sharded_local_mode.py"""

import os
import re
import subprocess
import tarfile

import pytest
import torch
from compose_jobs import containers, start_job
from job_lines import ranks
from test_reliability import finish, paced, read_until

from model import ImageClassifier
from sagemaker_lightning.checkpoints import layout, sharded_saves
from sagemaker_lightning.progress import weights_digest

pytestmark = pytest.mark.container

# 2 epochs of 6 steps of 2 × 8 images, a sharded last.ckpt every 2 steps; the model.pt of the last epoch
FSDP = [
    "--instance-count",
    "2",
    "trainer.strategy=fsdp",
    "model.arch=mobilenet_v3_small",
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=6",
    "trainer.limit_val_batches=1",
    "trainer.accelerator=cpu",
    "trainer.precision=32-true",
    "trainer.enable_progress_bar=False",
    "data.batch_size=8",
    "checkpoint.monitor=null",
    "last_checkpoint_every_n_steps=2",
]


def saved(output: str) -> int:
    return int(re.findall(r"saved last\.ckpt at epoch \d step (\d+)", output)[-1])


def test_fsdp_on_two_local_mode_hosts_exports_and_resumes_exactly_after_sigkill_and_sigterm(
    image, archive_dir, tmp_path
):
    job = start_job(image, archive_dir, tmp_path / "a", *FSDP)
    output = finish(job, [])
    assert job.returncode == 0, output[-5000:]
    assert "fsdp: FULL_SHARD over 2 processes, 11 blocks and 1 roots (net) sharded" in output
    found = ranks(output)
    assert sorted(found) == [0, 1] and [found[r].host[:6] for r in (0, 1)] == ["algo-1", "algo-2"]
    assert {closed.world for closed in found.values()} == {2} and found[0].step == 12
    expected = found[0].digest
    assert found[1].digest == expected  # the same consolidated weights on both hosts
    (tar_path,) = re.findall(r"^model\.tar\.gz: (\S+)$", output, re.M)
    with tarfile.open(tar_path) as tar:
        tar.extractall(tmp_path / "model")
    assert weights_digest(ImageClassifier.from_model_dir(str(tmp_path / "model"))) == expected  # the plain model

    ckpts = tmp_path / "ckpts"  # a mounted channel: one directory for both hosts
    code, pace = paced(tmp_path, 4)
    job = start_job(image, archive_dir, tmp_path / "b", "--checkpoints", str(ckpts), *code, *FSDP, *pace)
    lines = read_until(job, r"saved last\.ckpt at epoch 0 step 4")
    subprocess.run(["docker", "kill", *containers(job.folder)], check=True, capture_output=True)
    finish(job, lines)
    assert job.returncode != 0
    save, _ = sharded_saves.newest_complete(ckpts / "last.ckpt")
    step = torch.load(save / layout.META, weights_only=False)["global_step"]
    assert 4 <= step < 12

    code, pace = paced(tmp_path, 0)
    job = start_job(image, archive_dir, tmp_path / "c", "--checkpoints", str(ckpts), *code, *FSDP, *pace)
    lines = read_until(job, r"resuming at epoch \d step \d+")
    assert f"step {step} from last.ckpt" in lines[-1]  # where the last save left it
    lines += read_until(job, rf"saved last\.ckpt at epoch \d step (?!{step}\b)\d+")  # a save of its own
    stopping = containers(job.folder)
    # SageMaker's grace: a container still running after it is SIGKILLed (137), so 143 says it ended within it
    subprocess.run(["docker", "stop", "--time", "120", *stopping], check=True, capture_output=True)
    output = finish(job, lines)
    assert "stopped by SIGTERM (StopTrainingJob or a spot interruption) after saving last.ckpt" in output, output[
        -8000:
    ]
    stopped_at = saved(output)  # the save SIGTERM made
    codes = subprocess.run(
        ["docker", "inspect", "-f", "{{.State.ExitCode}}", *stopping], capture_output=True, text=True
    )
    assert codes.stdout.split() == ["143", "143"]  # 128 + SIGTERM on both hosts: stopped, not failed
    # SIGTERM's (or the step's, when the stop came right after it), complete, one file per rank, and the one complete
    # save before it; the older ones removed
    before, save = sorted(os.listdir(ckpts / "last.ckpt"))
    assert sharded_saves.missing(ckpts / "last.ckpt" / before) == []
    assert sharded_saves.missing(ckpts / "last.ckpt" / save) == [] and save.startswith(f"step-{stopped_at:09d}-")
    assert {"__0_0.distcp", "__1_0.distcp"} <= set(os.listdir(ckpts / "last.ckpt" / save))

    job = start_job(image, archive_dir, tmp_path / "d", "--checkpoints", str(ckpts), *FSDP)
    output = finish(job, [])
    assert job.returncode == 0, output[-5000:]
    assert re.search(rf"resuming at epoch \d step {stopped_at} from last.ckpt", output), output[-5000:]
    assert {rank: closed.digest for rank, closed in ranks(output).items()} == {0: expected, 1: expected}

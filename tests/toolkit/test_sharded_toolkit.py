"""trainer.strategy=fsdp on two toolkit hosts (localhost, 127.0.0.1) on CPU with gloo, in three small jobs: the
consolidated export, and exact resume after SIGKILL from the checkpoint directory as S3 gives it back.
MobileNet-V3-Small (BatchNorm, 11 blocks) keeps them cheap: the container tier trains a ConvNeXt. The kill cuts a
save's background write short: the job resumes from the complete save before it. The sharded save a SIGTERM writes,
and the exact resume from it, the interruption oracle proves on two hosts (test_resume_oracle.py, fsdp), and the
container tier under docker stop (tests/container/test_sharded_local_mode.py).

    .venv/bin/pytest tests/toolkit/test_sharded_toolkit.py
"""

import os
import re
import shutil

import pytest
import torch
from job_lines import ranks

from model import ImageClassifier
from sagemaker_lightning.checkpoints import sharded_saves
from sagemaker_lightning.progress import weights_digest

pytestmark = pytest.mark.toolkit

PLUGINS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plugins")
HOSTS = ["localhost", "127.0.0.1"]
FSDP = {  # six steps of 2 × 8 images; no best checkpoint, so model.pt is gathered from the shards at the end
    "trainer.strategy": "fsdp",
    "fsdp.activation_checkpointing": True,
    "trainer.max_epochs": 1,
    "trainer.limit_train_batches": 6,
    "trainer.limit_val_batches": 1,
    "trainer.enable_progress_bar": False,
    "trainer.precision": "32-true",
    "model.arch": "mobilenet_v3_small",
    "data.batch_size": 8,
    "checkpoint.save_top_k": 0,
    "last_checkpoint_every_n_steps": 2,
    "dist_timeout": 60,
}


def final_digests(*hosts) -> dict[int, str]:
    """{global rank: its final weights' digest}, every rank at the last step."""
    closed = ranks(*(host.output for host in hosts))
    assert all(c.world == 2 and c.step == 6 for c in closed.values()), closed
    return {rank: c.digest for rank, c in closed.items()}


def test_fsdp_exports_and_resumes_a_killed_run_exactly(run_hosts, archive_dir, tmp_path):
    first, second = run_hosts(HOSTS, FSDP, {"training": archive_dir})
    assert first.returncode == second.returncode == 0, first.output[-3000:] + second.output[-3000:]
    assert "fsdp: FULL_SHARD over 2 processes, 11 blocks and 1 roots (net) sharded" in first.output
    digests = final_digests(first, second)
    assert sorted(digests) == [0, 1] and digests[0] == digests[1]  # the same consolidated weights on both ranks
    exported = ImageClassifier.from_model_dir(first.path("model"))  # the plain, unsharded model takes model.pt
    assert weights_digest(exported) == digests[0] and os.listdir(second.path("model")) == []
    # the last save and the one of the step before it: step 6 was saved before the epoch's validation and again after
    # it, when the best checkpoint is known; the second replaced the first, and step 4's stays. Complete: one file
    # per rank, in rank 0's directory (ModelCheckpoint's dirpath is rank 0's)
    saves = sorted(os.listdir(first.path("checkpoints", "last.ckpt")))
    assert [s[:14] for s in saves] == ["step-000000004", "step-000000006"]
    files = [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]
    assert all(sorted(os.listdir(first.path("checkpoints", "last.ckpt", s))) == files for s in saves)

    # rank 0 SIGKILLed inside the background write of the save at step 4: its shards written halfway, no .metadata (DCP
    # writes it once every rank's file is whole), training gone on meanwhile; step 2's save complete before it
    ckpts = tmp_path / "checkpoints"  # one directory for both hosts, as local mode's, FSx or EFS
    kill = {"trainer.callbacks+": "faults.KillRank", "trainer.callbacks.rank": 0, "trainer.callbacks.step": 4}
    kill |= {"trainer.callbacks.at": "last.ckpt", "trainer.callbacks.during": "write"}
    hps = {**FSDP, **kill, "checkpoint.dirpath": str(ckpts)}
    killed, _ = run_hosts(HOSTS, hps, {"training": archive_dir}, env={"PYTHONPATH": PLUGINS})
    assert "saved last.ckpt at epoch 0 step 2" in killed.output, killed.output[-3000:]
    assert killed.returncode != 0 and "saved last.ckpt at epoch 0 step 4" not in killed.output  # said once complete
    save = sorted(os.listdir(ckpts / "last.ckpt"))[0]
    assert save.startswith("step-000000002-") and sharded_saves.missing(ckpts / "last.ckpt" / save) == []
    restored = tmp_path / "restored"  # what a restarted job gets back from checkpoint_s3_uri
    shutil.copytree(ckpts, restored)
    resumed = run_hosts(HOSTS, {**FSDP, "checkpoint.dirpath": str(restored)}, {"training": archive_dir})
    assert all(host.returncode == 0 for host in resumed), resumed[0].output[-3000:]
    assert re.search(r"not resuming from step-000000004-\d+ lacks .metadata", resumed[0].output), resumed[0].output
    assert "resuming at epoch 0 step 2 from last.ckpt" in resumed[0].output
    assert final_digests(*resumed) == digests  # the uninterrupted run's weights
    assert torch.load(resumed[0].path("model", "model.pt"), weights_only=True).keys() == exported.state_dict().keys()

"""Checkpoints written to s3:// in the background (checkpoints/writer.py), on a moto server: in concurrent parts,
last.ckpt's previous object kept by a server-side copy, the same state named again by a copy, a removal after the
write before it, and the state read back as it was saved.

    .venv/bin/pytest tests/cloud/test_checkpoints_s3.py
"""

import boto3
import pytest
import pytorch_lightning
import torch

from sagemaker_lightning.checkpoints import writer as background
from sagemaker_lightning.checkpoints.io import AtomicCheckpointIO, read
from sagemaker_lightning.cli.lightning_package import made

pytestmark = pytest.mark.cloud


def test_s3_saves_go_in_parts_keep_the_previous_one_and_write_each_state_once(aws):
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="checkpoints")
    io = made(AtomicCheckpointIO, pytorch_lightning)()
    weight = torch.zeros(5 * background.PART_BYTES // 8)  # 2.5 parts of float32: three parts
    saved = {"global_step": 3, "loops": {}, "state_dict": {"w": weight}, "callbacks": {}}
    io.save_checkpoint(saved, "s3://checkpoints/job/epoch=0-step=3.ckpt")
    io.save_checkpoint(saved, "s3://checkpoints/job/last.ckpt")  # the same state: a server-side copy
    weight += 1
    io.save_checkpoint({**saved, "global_step": 4}, "s3://checkpoints/job/last.ckpt")
    io.remove_checkpoint("s3://checkpoints/job/epoch=0-step=3.ckpt")
    io.wait()

    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="checkpoints")["Contents"])
    assert keys == ["job/last-previous.ckpt", "job/last.ckpt"]
    assert s3.head_object(Bucket="checkpoints", Key="job/last.ckpt")["ETag"].endswith('-3"')  # uploaded in 3 parts
    last, previous = read("s3://checkpoints/job/last.ckpt"), read("s3://checkpoints/job/last-previous.ckpt")
    assert last["global_step"] == 4 and torch.equal(last["state_dict"]["w"], torch.ones_like(weight))
    assert previous["global_step"] == 3 and torch.equal(previous["state_dict"]["w"], torch.zeros_like(weight))

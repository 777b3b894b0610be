"""Checkpoints written to s3:// in the background (checkpoints/writer.py), on a moto server: in concurrent parts,
last.ckpt's previous object kept by a server-side copy, the same state named again by a copy, a removal after the
write before it, and the state read back as it was saved.

    .venv/bin/pytest tests/cloud/test_checkpoints_s3.py
"""

import contextlib
import os
import threading

import boto3
import botocore.exceptions
import pytest
import pytorch_lightning
import torch

from sagemaker_lightning.checkpoints import s3_transfer
from sagemaker_lightning.checkpoints import writer as background
from sagemaker_lightning.checkpoints.io import BackgroundCheckpointIO, read
from sagemaker_lightning.toolbox.lightning_package import made

pytestmark = pytest.mark.cloud


def test_s3_saves_go_in_parts_keep_the_previous_one_and_write_each_state_once(aws):
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="checkpoints")
    io = made(BackgroundCheckpointIO, pytorch_lightning)()
    weight = torch.zeros(5 * s3_transfer.PART_BYTES // 8)  # 2.5 parts of float32: three parts
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


def test_last_ckpts_previous_object_is_copied_while_the_new_one_is_sent_and_before_it_appears(aws, monkeypatch):
    """The copy that keeps the previous object runs beside the upload, not ahead of it (a save asked meanwhile waited
    for both), and the new object appears only once it is done: it copies the old one. Here the copy goes on only once
    every part is sent, so the completion must wait for it; ahead of the upload, it would wait for parts in vain."""
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="checkpoints")
    url, weight = "s3://checkpoints/job/last.ckpt", torch.zeros(5 * s3_transfer.PART_BYTES // 8)  # three parts
    background.persist({"global_step": 3, "state_dict": {"w": weight}}, url)
    happened, sent, keep = [], threading.Event(), background.keep_previous

    def part(**kwargs):
        happened.append("part sent")
        if happened.count("part sent") == 3:
            sent.set()

    def completed(**kwargs):
        happened.append("completed")

    def copy_once_the_parts_are_sent(path):
        happened.append("copy asked")
        sent.wait(10)
        keep(path)
        happened.append("copy done")

    events = s3_transfer.s3_client().meta.events
    events.register("after-call.s3.UploadPart", part)
    events.register("before-call.s3.CompleteMultipartUpload", completed)
    monkeypatch.setattr(background, "keep_previous", copy_once_the_parts_are_sent)
    try:
        background.persist({"global_step": 4, "state_dict": {"w": weight + 1}}, url)
    finally:
        events.unregister("after-call.s3.UploadPart", part)
        events.unregister("before-call.s3.CompleteMultipartUpload", completed)
    assert happened.count("part sent") == 3 and happened[-2:] == ["copy done", "completed"]
    assert read("s3://checkpoints/job/last-previous.ckpt")["global_step"] == 3
    assert read(url)["global_step"] == 4


def test_a_failed_copy_of_the_previous_object_aborts_the_upload_and_last_ckpt_stays(aws, monkeypatch):
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="checkpoints")
    url, weight = "s3://checkpoints/job/last.ckpt", torch.zeros(3 * s3_transfer.PART_BYTES // 8)
    background.persist({"global_step": 3, "state_dict": {"w": weight}}, url)

    def denied(path):
        raise PermissionError("Access Denied")

    monkeypatch.setattr(background, "keep_previous", denied)
    with pytest.raises(PermissionError, match="Access Denied"):
        background.persist({"global_step": 4, "state_dict": {"w": weight}}, url)
    assert not s3.list_multipart_uploads(Bucket="checkpoints").get("Uploads")  # aborted, no parts left behind
    assert read(url)["global_step"] == 3


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot pickle this")


def save_then_fail(obj, f, *args, save=torch.save, **kwargs):
    """torch.save that fails after 3 parts' worth of a checkpoint went out (a failed copy from the GPU, say); with
    torch's format a pickling error comes before any byte, a failure midway only in a tensor's data."""
    save({"w": torch.zeros(3 * s3_transfer.PART_BYTES // 4)}, f)
    raise RuntimeError("cannot copy this")


@pytest.mark.parametrize("midway", [False, True], ids=["pickling fails", "fails after 3 parts"])
def test_an_s3_save_whose_serialising_fails_leaves_no_object_and_says_why(aws, monkeypatch, midway):
    """The upload reads torch.save's output as it is written: an end without torch.save's success would complete an
    empty or truncated object. It is aborted instead, and the error is the save's."""
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="checkpoints")
    saved = {"global_step": 3, "state_dict": {"w": torch.zeros(4)}, "callbacks": {}, "odd": Unpicklable()}
    if midway:
        monkeypatch.setattr(background.torch, "save", save_then_fail)
    with pytest.raises(RuntimeError, match="cannot copy this" if midway else "cannot pickle this"):
        background.persist(saved, "s3://checkpoints/job/epoch=0-step=3.ckpt")  # the writer thread's write
    assert s3.list_objects_v2(Bucket="checkpoints").get("KeyCount") == 0
    assert not s3.list_multipart_uploads(Bucket="checkpoints").get("Uploads")  # aborted, no parts left behind


def pipes() -> list[str]:
    """This process's open pipes."""
    links = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
    return sorted(link for link in links if link.startswith("pipe:"))


def test_an_s3_save_whose_upload_fails_ends_its_serialising_too(aws):
    """torch.save blocked on the pipe nobody reads any more (the bucket is gone) ends; no thread or pipe stays."""
    before = pipes()
    with pytest.raises(botocore.exceptions.ClientError, match="NoSuchBucket"):
        background.persist(
            {"w": torch.zeros(3 * s3_transfer.PART_BYTES // 4)}, "s3://no-bucket/job/epoch=0-step=3.ckpt"
        )
    assert pipes() == before
    assert not [t for t in threading.enumerate() if t.name.startswith("checkpoint-upload")]


def test_s3_reads_fetch_ranged_parts_at_once_and_a_missing_object_is_not_found(aws):
    """A resume reads the object in concurrent ranged parts (Lightning's read is one stream), then loads it in memory;
    a missing object is FileNotFoundError, as Lightning's own read says it, not a transient failure tried again."""
    boto3.client("s3").create_bucket(Bucket="checkpoints")
    saved = {"global_step": 7, "state_dict": {"w": torch.arange(5 * s3_transfer.PART_BYTES // 8, dtype=torch.float32)}}
    background.persist(saved, "s3://checkpoints/job/last.ckpt")
    ranges = []

    def record(request, **kwargs):
        ranges.append(request.headers.get("Range"))

    events = s3_transfer.s3_client().meta.events
    events.register("before-send.s3.GetObject", record)
    try:
        loaded = made(BackgroundCheckpointIO, pytorch_lightning)().load_checkpoint("s3://checkpoints/job/last.ckpt")
    finally:
        events.unregister("before-send.s3.GetObject", record)
    assert loaded["global_step"] == 7 and torch.equal(loaded["state_dict"]["w"], saved["state_dict"]["w"])
    assert len(ranges) == 3 and all(r and r.startswith(b"bytes=") for r in ranges), ranges  # 2.5 parts: three ranges
    with pytest.raises(FileNotFoundError):
        read("s3://checkpoints/job/no-such.ckpt")

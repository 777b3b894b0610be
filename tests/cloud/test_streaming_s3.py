"""A dataset streamed from S3 (moto) whose cache cannot hold one of its chunks fails in one line before the first
step (sagemaker_lightning/streaming.py): litdata itself would download into a cache it must empty at once."""

import os

import boto3
import numpy as np
import pytest

from sagemaker_lightning import UserError, streaming

pytestmark = pytest.mark.cloud


def test_a_cache_too_small_for_one_chunk_is_one_line(aws, tmp_path):
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.streaming.writer import BinaryWriter

    writer = BinaryWriter(str(tmp_path / "ids"), chunk_size=10)
    for i in range(30):
        writer[i] = {"id": i, "x": np.zeros(64, np.float32)}
    writer.done()
    writer.merge()
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="datasets")
    for name in os.listdir(tmp_path / "ids"):
        s3.upload_file(str(tmp_path / "ids" / name), "datasets", f"ids/{name}")
    dataset = StreamingDataset("s3://datasets/ids", cache_dir=str(tmp_path / "cache"), max_cache_size=1000)
    with pytest.raises(UserError) as raised:
        streaming.check(StreamingDataLoader(dataset, batch_size=5), 0, 1, None)
    assert str(raised.value).startswith(
        "the streaming cache may hold 1000 bytes, less than one chunk of s3://datasets/ids (2"
    ), str(raised.value)
    roomy = StreamingDataset("s3://datasets/ids", cache_dir=str(tmp_path / "cache2"), max_cache_size=100_000)
    streaming.check(StreamingDataLoader(roomy, batch_size=5), 0, 1, None)

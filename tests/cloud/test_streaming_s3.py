"""A dataset streamed from S3 (moto) whose cache cannot hold one of its chunks fails in one line before the first
step (sagemaker_lightning/data/streaming.py): litdata itself would download into a cache it must empty at once."""

import os
import re

import boto3
import numpy as np
import pytest
import torch

from sagemaker_lightning import UserError
from sagemaker_lightning.data import streaming

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


def test_the_example_streams_cifar_from_s3_and_from_a_channel(aws, archive_dir, tmp_path):
    """The example's StreamingCIFAR10DataModule on what upload_data.py --format litdata writes: from its s3:// prefix
    (moto), and from a directory that holds it (a channel); each trains its steps. The crops are the same for the
    same (epoch, id) in any process, other in another epoch."""
    import optimize_data
    import train
    from streaming_data import Augment

    files = optimize_data.optimize(archive_dir, str(tmp_path / "optimized"), "64KB")
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="datasets")
    for name, path in files.items():
        s3.upload_file(path, "datasets", f"cifar-litdata/{name}")
    tiny = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1",
            "--trainer.accelerator=cpu", f"--logger.save_dir={tmp_path}",
            "--trainer.enable_progress_bar=false", "--model.arch=mobilenet_v3_small", "--data=StreamingCIFAR10DataModule",
            "--data.batch_size=16", "--data.num_workers=0", "--trainer.precision=32-true"]  # fmt: skip
    for data_dir in ("s3://datasets/cifar-litdata/", str(tmp_path / "optimized")):
        cli = train.main([*tiny, f"--data.data_dir={data_dir}", f"--trainer.default_root_dir={tmp_path}"])
        assert cli.trainer.global_step == 2
    augment = Augment(seed=42, train=True)
    augment.dataset = type("Dataset", (), {"current_epoch": 1})()
    item = {"id": 3, "image": np.arange(32 * 32 * 3, dtype=np.uint8).reshape(32, 32, 3), "label": 5}
    first, again = augment(item), augment(item)
    augment.dataset.current_epoch = 2
    assert first[1] == 5 and first[0].shape == (3, 32, 32) and torch.equal(first[0], again[0])
    assert not torch.equal(augment(item)[0], first[0])


def test_litdatas_bare_s3_error_is_one_line(aws, tmp_path):
    """A project that makes its StreamingDataset without check_source, on a prefix with no index.json: litdata's
    bare 404 becomes one line without a traceback (sagemaker_lightning/failure.py)."""
    from litdata import StreamingDataset

    from sagemaker_lightning import failure

    boto3.client("s3").create_bucket(Bucket="datasets")
    with pytest.raises(Exception) as raised:
        StreamingDataset("s3://datasets/nothing", cache_dir=str(tmp_path / "cache"))
    line, code, traceback, file = failure.explain(raised.value, stage="train")
    # the request that found nothing: HeadObject, or GetObject where response checksums are not validated (conftest.py)
    failed = r"\((HeadObject: 404 Not Found|GetObject: NoSuchKey The specified key does not exist\.)\)"
    assert re.match(rf"a streamed dataset could not be read from S3 {failed}: its s3:// ", line), line
    assert (code, traceback, file) == (1, False, True)


def test_a_prefix_whose_data_would_run_code_is_one_line_and_runs_nothing(aws, tmp_path):
    """The issue's case on S3 (tests/plugins/planted_data.py): check_source reads the prefix's index.json and refuses
    the planted field in one line, and so does the runtime's check of a StreamingDataset of the prefix; the marker is
    never written. The same items without it pass both."""
    from litdata import StreamingDataLoader, StreamingDataset
    from planted_data import optimized

    marker = str(tmp_path / "ran")
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="datasets")
    for name, marked in (("planted", marker), ("clean", None)):
        folder = optimized(tmp_path / name, marked)
        for file in os.listdir(folder):
            s3.upload_file(os.path.join(folder, file), "datasets", f"{name}/{file}")
    line = "s3://datasets/planted holds data that could run code when read, refused unread: field 'extra' is stored as "
    with pytest.raises(UserError) as raised:
        streaming.check_source("s3://datasets/planted")
    assert str(raised.value).startswith(f"{line}'pickle'") and "\n" not in str(raised.value), str(raised.value)
    dataset = StreamingDataset("s3://datasets/planted", cache_dir=str(tmp_path / "cache"))
    with pytest.raises(UserError, match=f"^{line}'pickle'"):
        streaming.check(StreamingDataLoader(dataset, batch_size=4), 0, 1, None)
    assert not os.path.exists(marker)
    streaming.check_source("s3://datasets/clean")
    clean = StreamingDataset("s3://datasets/clean", cache_dir=str(tmp_path / "cache2"))
    streaming.check(StreamingDataLoader(clean, batch_size=4), 0, 1, None)

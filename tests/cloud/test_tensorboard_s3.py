"""TensorBoard logs written straight to s3:// (fsspec + s3fs, and TensorBoard's own S3 writer) during a real run."""

import os
import subprocess
import sys

import boto3
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

pytestmark = pytest.mark.cloud
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_tensorboard_events_reach_s3_during_training(aws, archive_dir, tmp_path):
    boto3.client("s3").create_bucket(Bucket="tensorboard-logs")
    cmd = [
        sys.executable,
        os.path.join(ROOT, "app", "example", "train.py"),
        "--data.data_dir",
        archive_dir,
        "--logger.save_dir",
        "s3://tensorboard-logs/runs",
        "--logger.flush_secs",
        "1",
        "--trainer.max_epochs",
        "2",
        "--trainer.limit_train_batches",
        "3",
        "--trainer.limit_val_batches",
        "1",
        "--trainer.log_every_n_steps",
        "1",
        "--trainer.accelerator",
        "cpu",
        "--trainer.precision",
        "32-true",
        "--data.batch_size",
        "16",
        "--trainer.callbacks+=tensorboard_check.EventsOnS3Already",
    ]
    env = {**os.environ, **aws, "PYTHONPATH": os.path.join(ROOT, "tests", "plugins")}
    run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="tensorboard-logs")["Contents"]]
    (events,) = [k for k in keys if "events.out.tfevents" in k]
    assert events.startswith("runs/cifar10/version_0/") and "runs/cifar10/version_0/hparams.yaml" in keys
    scalars = EventAccumulator(f"s3://tensorboard-logs/{events}").Reload().Tags()["scalars"]
    assert {"train/loss", "val/acc", "val/loss"} <= set(scalars)

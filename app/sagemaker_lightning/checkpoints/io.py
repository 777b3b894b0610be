"""How checkpoints are read and written. Read: weights only, as Lightning reads them when it resumes (a checkpoint is
a pickle, and whoever can write to the checkpoint location could otherwise run code in the job), on the CPU, a read
that fails for a transient reason (S3 throttling, a timeout, a dropped connection) tried again, never taken for a
corrupt file. Written: atomically (atomic.py), by AtomicCheckpointIO, the trainer's CheckpointIO plugin.

    python -c "from sagemaker_lightning.checkpoints import io; print(io.read('ckpts/last.ckpt').keys())"
"""

import os
import time
import zipfile
from collections.abc import Callable
from typing import TypeVar

import fsspec
import fsspec.implementations.local
import torch

from sagemaker_lightning import watchdog
from sagemaker_lightning.checkpoints.atomic import replacing
from sagemaker_lightning.failure import UserError
from sagemaker_lightning.lines import say

TRIES = 3  # reads of a checkpoint that fail for a transient reason, before the job fails naming the file
RETRY_S = 2.0  # the wait before the second try, doubled before each next one
T = TypeVar("T")


def retried(read: Callable[[], T], url: str) -> T:
    """read(), tried again when it fails with an OSError other than a missing file (s3fs raises S3's throttling and
    timeouts as OSError, as the operating system does a dropped connection); a UserError naming `url` once TRIES
    reads failed."""
    for attempt in range(TRIES):
        try:
            return read()
        except FileNotFoundError:
            raise
        except OSError as e:
            why = f"{type(e).__name__}: {e}"
            if attempt == TRIES - 1:
                raise UserError(
                    f"cannot read {url} ({why}), tried {TRIES} times; check that the job can read its checkpoint "
                    "location (permissions, network), then restart it"
                ) from e
            say(f"reading {url} failed ({why}); trying again")
            time.sleep(RETRY_S * 2**attempt)
    raise AssertionError("unreachable")


def read(url: str):
    """The checkpoint at `url` (a path, or an fsspec URL such as s3://bucket/key), weights only, on the CPU; transient
    failures retried (retried)."""
    fs, path = fsspec.core.url_to_fs(url)

    def load():
        if isinstance(fs, fsspec.implementations.local.LocalFileSystem):
            # a complete file in torch.save's zip format is mapped, its tensors not read
            return torch.load(path, map_location="cpu", mmap=zipfile.is_zipfile(path), weights_only=True)
        with fs.open(path, "rb") as f:
            return torch.load(f, map_location="cpu", weights_only=True)

    return retried(load, url)


class AtomicCheckpointIO:
    """Each checkpoint goes to a partial name first and is renamed when complete (atomic.replacing; remote paths are
    written as Lightning writes them). A read that fails for a transient reason is tried again (retried); the
    checkpoint a job resumes from is the one global rank 0 chose (`resume_point`: resume.ResumePoint)."""

    BASE = "plugins.io.TorchCheckpointIO"

    def __init__(self, resume_point=None):
        super().__init__()
        self.resume_point = resume_point

    def load_checkpoint(self, path, *args, **kwargs):
        path = self.resume_point.choose(path) if self.resume_point else path
        load = super().load_checkpoint
        return retried(lambda: load(path, *args, **kwargs), str(path))

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        path = str(path)
        with watchdog.busy(f"writing {os.path.basename(path)}"):  # peers that wait for it see no hang
            if "://" in path:
                return super().save_checkpoint(checkpoint, path, storage_options)
            with replacing(path) as partial:
                super().save_checkpoint(checkpoint, partial, storage_options)

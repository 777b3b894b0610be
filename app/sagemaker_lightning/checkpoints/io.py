"""How checkpoints are read and written. Read: weights only, here and where Lightning resumes (a checkpoint is a
pickle, and whoever can write to the checkpoint location could otherwise run code in the job), pathlib's paths
admitted (hyperparameters hold them) and a class torch does not admit named with its fix, on the CPU; a read that
fails for a transient reason (S3 throttling, a timeout, a dropped connection) tried again. Neither is taken for a
corrupt file. From S3 a checkpoint is read in concurrent ranged parts (s3_transfer.py). Written: in the background
and atomically, whole files (writer.py) and fsdp's shards (sharded_writer.py), by BackgroundCheckpointIO, the
trainer's CheckpointIO plugin, which hands each write to writer.py's thread.

    python -c "from sagemaker_lightning.checkpoints import io; print(io.read('ckpts/last.ckpt').keys())"
"""

import contextlib
import os
import pathlib
import pickle
import re
import time
import zipfile
from collections.abc import Callable
from typing import TypeVar

import fsspec
import torch

from sagemaker_lightning.checkpoints import s3_transfer
from sagemaker_lightning.checkpoints.writer import Writer
from sagemaker_lightning.failure import UserError
from sagemaker_lightning.lines import say
from sagemaker_lightning.toolbox.location import remote

TRIES = 3  # reads of a checkpoint that fail for a transient reason, before the job fails naming the file
RETRY_S = 2.0  # the wait before the second try, doubled before each next one
# admitted by every weights-only load here: rebuilt from their parts, nothing run (hyperparameters often hold them)
PATHS = [pathlib.PurePosixPath, pathlib.PureWindowsPath, pathlib.PosixPath, pathlib.WindowsPath]
UNSUPPORTED = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")  # torch's weights-only refusal of a global
BLOCKED = re.compile(r"unsupported GLOBAL ([\w.]+) whose module \w+ is blocked")  # os, sys: refused even if admitted
T = TypeVar("T")


class UnsafeGlobal(pickle.UnpicklingError):
    """A pickle names a global that no checkpoint holds (a function of os, say): not loaded, nothing run."""


def refusal(e: BaseException, url: str) -> Exception | None:
    """What a weights-only load of `url` that failed on a global torch does not admit raises instead of torch's text
    (several lines, terminal escapes, a hint to load any pickle), else None. Not "a corrupt file": a UserError for
    what may be the project's own class (in hyper_parameters, say), with the fix; a global of a module torch blocks
    (os, sys) is no project's: UnsafeGlobal, the file skipped as one that does not load (resume.py)."""
    if not isinstance(e, pickle.UnpicklingError):
        return None
    if found := BLOCKED.search(str(e)):
        return UnsafeGlobal(f"names {found[1]}, a global of a module torch never loads from a checkpoint")
    if not (found := UNSUPPORTED.search(str(e))):
        return None
    name = found[1]
    return UserError(
        f"{url} names {name}, which a weights-only load (nothing in a checkpoint runs) does not admit: if {name} is "
        f"the project's (in hyper_parameters, say), add torch.serialization.add_safe_globals([{name}]) to the "
        f"project or keep it out of hyper_parameters; if the project has no {name}, the file is not its own"
    )


@contextlib.contextmanager
def admitted(url: str):
    """Weights-only loads of `url` inside: pathlib's paths admitted, a global torch does not admit named (refusal)."""
    try:
        with torch.serialization.safe_globals(PATHS):
            yield
    except pickle.UnpicklingError as e:
        if (instead := refusal(e, url)) is None:
            raise
        raise instead from None


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
        with admitted(url):
            if url.startswith("s3://"):
                return s3_load(url)
            if not remote(url):
                # a complete file in torch.save's zip format is mapped, its tensors not read
                return torch.load(path, map_location="cpu", mmap=zipfile.is_zipfile(path), weights_only=True)
            with fs.open(path, "rb") as f:
                return torch.load(f, map_location="cpu", weights_only=True)

    return retried(load, url)


def s3_load(url, map_location=None, weights_only: bool = True):
    """The checkpoint at s3:// `url` as Lightning's TorchCheckpointIO.load_checkpoint loads one (on the CPU unless
    mapped elsewhere), fetched in concurrent parts (s3_transfer.py) and read in memory."""
    return torch.load(s3_transfer.download(str(url)), map_location=map_location or "cpu", weights_only=weights_only)


class BackgroundCheckpointIO:
    """Each checkpoint of a fit is written in the background, to a partial name first and renamed when complete, or
    uploaded whole (writer.py); a load, a removal and the trainer's teardown wait their turn behind the writes, and a
    save after the teardown is written when it returns. A read that fails for a transient reason is tried again
    (retried); the checkpoint a job resumes from is the one global rank 0 chose (`resume_point`: resume.ResumePoint),
    read weights only unless weights_only=False is asked (before torch 2.6, the SMDDP flavors' torch, its default
    loads any pickle)."""

    BASE = "plugins.io.TorchCheckpointIO"

    def __init__(self, *, resume_point=None, busy=None, ledger=None, sharded=None):
        """busy: the process's Status.busy (toolbox/status.py): a wait for a write marked so is no hang to the
        watchdog; ledger: the attempt's goodput.Ledger, where a read is the restore's time and what a save holds the
        training for its stall; sharded: under fsdp, what makes the writer of its sharded saves from this one's whole-file
        writer (sharded_writer.ShardedWriter, given by checkpoints/concern.py: that module reads with this one's)."""
        super().__init__()
        self.resume_point = resume_point
        self.busy = busy or (lambda what: contextlib.nullcontext())
        self.timing = ledger.timing if ledger else (lambda term: contextlib.nullcontext())
        self.writer = Writer()
        self.sharded = sharded(self.writer) if sharded else None  # fsdp's last.ckpt/

    def load_checkpoint(self, path, *args, weights_only=None, **kwargs):
        self.wait()  # the file may be a save still in flight
        path = self.resume_point.choose(path) if self.resume_point else path
        load = s3_load if str(path).startswith("s3://") else super().load_checkpoint
        weights_only = weights_only is not False
        try:
            with self.timing("restore"), admitted(str(path)):
                return retried(lambda: load(path, *args, weights_only=weights_only, **kwargs), str(path))
        except pickle.UnpicklingError as e:  # chosen when it loaded (resume.py): replaced since, or given as ckpt_path
            raise UserError(f"cannot load {path}: {type(e).__name__}: {e}; delete it, or give another") from None

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        # a save waits for the one in flight: peers that wait for it see no hang
        with self.busy(f"saving {os.path.basename(str(path))}"), self.timing("checkpoint stall"):
            if self.sharded and self.sharded.takes(checkpoint):  # every rank: its shards
                self.sharded.save(checkpoint, pathlib.Path(path))
            else:  # global rank 0: the whole file
                self.writer.save(checkpoint, str(path))

    def remove_checkpoint(self, path) -> None:
        self.writer.remove(str(path))

    def wait(self) -> None:
        """Until every write asked for is done; one that failed raises, as one line."""
        with self.busy("writing checkpoints"), self.timing("checkpoint stall"):
            self.writer.wait()

    def announce(self) -> None:
        """Say the saves of last.ckpt written since the last call (writer.py): every step, from the training thread."""
        self.writer.announce()

    def open(self) -> None:
        """A fit starts (LastCheckpoint.setup): its saves in the background, until its teardown."""
        self.writer.open()

    def teardown(self) -> None:
        """The end of a fit: its writes done (one that failed raises), the writer's thread ended, as Lightning's
        AsyncCheckpointIO ends its own; a save after it (trainer.save_checkpoint) is written before it returns."""
        try:
            self.wait()
        finally:
            self.writer.close()
            if self.sharded:
                self.sharded.close()

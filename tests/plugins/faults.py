"""Faults for the tests, added to a job as `trainer.callbacks+=faults.KillRank` (this folder on PYTHONPATH). Made for
whichever Lightning package the project under test imports (the example: pytorch_lightning; the user project:
lightning.pytorch)."""

import errno
import os
import signal
import subprocess
import sys
import time

import proctree
import torch
from torch.distributed.checkpoint import FileSystemWriter

from sagemaker_lightning.checkpoints import s3_transfer
from sagemaker_lightning.toolbox.lightning_package import package

pl = package()


class KillRank(pl.Callback):
    """SIGKILL one rank, as the kernel's out-of-memory killer does to a process (and a lost spot instance to every
    process of its host): at the start of one step, or inside a write at that step of the file `at` (last.ckpt,
    model.pt; checkpoints are written by the runtime's writer thread): halfway through writing its temporary file,
    just before its rename into place (its content complete under its temporary name), or in its upload to S3 once
    the previous object is copied, before the new one completes (s3_transfer.upload holds the completion for the copy). Under fsdp, "write" at last.ckpt cuts the rank's shards of
    the save at `step` in half once DCP's writer thread has written them, before any rank's save is complete."""

    def __init__(
        self, rank: int = 1, step: int = 2, at: str | None = None, attempt: int | None = None, during: str = "rename"
    ):
        """rank: the global rank to kill (in a one-process job, the only one); step: the global step; at: the file
        whose write it cuts, or None for the start of the step; attempt: under torchrun, only in that attempt
        (TORCHELASTIC_RESTART_COUNT), so that the restarted ranks pass the step; during: "write", "rename" or
        "upload"."""
        self.rank, self.step, self.at, self.attempt, self.during = rank, step, at, attempt, during

    def _here(self, trainer) -> bool:
        rank = 0 if trainer.world_size == 1 else self.rank
        attempt = self.attempt is None or os.environ.get("TORCHELASTIC_RESTART_COUNT") == str(self.attempt)
        return trainer.global_rank == rank and trainer.global_step == self.step and attempt

    def setup(self, trainer, pl_module, stage):
        if self.at is None:
            return
        replace, save, upload = os.replace, torch.save, s3_transfer.upload  # what the runtime's writes go through

        def replace_unless_here(source, target, *args, **kwargs):
            if self.during == "rename" and os.path.basename(target) == self.at and self._here(trainer):
                os.kill(os.getpid(), signal.SIGKILL)
            return replace(source, target, *args, **kwargs)

        def save_half(obj, f, *args, **kwargs):
            save(obj, f, *args, **kwargs)
            if self.during == "write" and os.path.basename(str(f)) == f".{self.at}.partial" and self._here(trainer):
                os.truncate(f, os.path.getsize(f) // 2)
                os.kill(os.getpid(), signal.SIGKILL)

        def upload_unless_here(data, url, beside=None):
            if self.during == "upload" and url.rsplit("/", 1)[-1] == self.at and self._here(trainer):

                def copied_then_killed():  # its parts on their way, the object held until this returns: it never does
                    (beside or (lambda: None))()
                    os.kill(os.getpid(), signal.SIGKILL)

                return upload(data, url, beside=copied_then_killed)
            return upload(data, url, beside=beside)

        def shards_half(storage, plan, planner):
            written = write_shards(storage, plan, planner)  # this rank's file, whole, in DCP's writer thread
            named = f"step-{self.step:09d}-" in str(storage.path)  # the save of that step: training has gone on
            if self.during == "write" and self.at == "last.ckpt" and named and trainer.global_rank == self.rank:
                for file in (os.path.join(storage.path, n) for n in os.listdir(storage.path) if n.endswith(".distcp")):
                    os.truncate(file, os.path.getsize(file) // 2)
                os.kill(os.getpid(), signal.SIGKILL)
            return written

        os.replace, torch.save, s3_transfer.upload = replace_unless_here, save_half, upload_unless_here
        write_shards = FileSystemWriter.write_data  # fsdp's last.ckpt/: each rank's shards (sharded_writer.py)
        FileSystemWriter.write_data = shards_half

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.at is None and self._here(trainer):
            written(trainer)
            os.kill(os.getpid(), signal.SIGKILL)


def written(trainer) -> None:
    """Wait for the saves in flight (the runtime writes checkpoints in the background): a kill at a step's start comes
    after the saves asked for before it are written, as the tests' expectations have it; kills inside a write are
    KillRank's `during`."""
    wait = getattr(trainer.strategy.checkpoint_io, "wait", None)
    if wait:
        wait()


class KillWhenTracked(pl.Callback):
    """SIGKILL this process (a one-host job's) at the start of the step after global step `step`, once the job's
    MLflow run holds train/loss at `step`: a job restarted from an earlier checkpoint trains steps the run has."""

    def __init__(self, step: int = 3):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step != self.step:
            return
        from mlflow.tracking import MlflowClient

        from sagemaker_lightning.tracking.record import read_record

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            run_id = read_record(trainer.checkpoint_callback.dirpath).get("run_id")
            history = MlflowClient().get_metric_history(run_id, "train/loss") if run_id else []
            if any(m.step == self.step for m in history):
                written(trainer)
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.1)
        raise AssertionError(f"the run did not hold train/loss at step {self.step} within 60 s")


class KillProcess(pl.Callback):
    """SIGKILL another process group (a server the job uses: conftest.MlflowServer) from global rank 0 at the start
    of global step `step`."""

    def __init__(self, pid: int, step: int = 2):
        self.pid, self.step = pid, step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.is_global_zero and trainer.global_step == self.step:
            from sagemaker_lightning.tracking.record import read_record

            deadline = time.monotonic() + 60  # once the job's run is open: what it held is read afterwards
            while not read_record(trainer.checkpoint_callback.dirpath) and time.monotonic() < deadline:
                time.sleep(0.1)
            os.killpg(self.pid, signal.SIGKILL)


class Pace(pl.Callback):
    """Each training step from `step` on lasts at least `seconds`: a kill that a test sends when it sees an earlier
    step's line (which passes through docker compose and the SDK first) lands before the job ends, however fast the
    machine. With `rank`, that rank's steps only: a straggler, which every other rank waits for in each step."""

    def __init__(self, step: int = 0, seconds: float = 1.0, rank: int | None = None):
        self.step, self.seconds, self.rank = step, seconds, rank

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step >= self.step and self.rank in (None, trainer.global_rank):
            time.sleep(self.seconds)


class Hang(pl.Callback):
    """One rank stops making progress at the start of one step: `stop` SIGSTOPs its process (a frozen host: none of
    its threads run), else it sleeps in Python (a deadlock in the project's code), until the job ends it."""

    def __init__(self, rank: int = 1, step: int = 2, stop: bool = False):
        self.rank, self.step, self.stop = rank, step, stop

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            if self.stop:
                os.kill(os.getpid(), signal.SIGSTOP)
            time.sleep(3600)


def entrypoint() -> int:
    """This host's entrypoint (PID 1 in a container): the nearest ancestor running sagemaker_lightning.boot.entrypoint."""
    pid = os.getpid()
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"sagemaker_lightning.boot.entrypoint" in f.read():
                return pid
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])  # the parent
    return 1


class StopJob(pl.Callback):
    """SIGTERM to this host's entrypoint, as SageMaker signals every host's PID 1 on StopTrainingJob and spot
    interruption: at the start of one step, or during the validation after it; optionally SageMaker's SIGKILL after a
    grace period (120 s there), and a long validation. With `node_rank` in a validation, the other hosts end that
    validation's first batch only once the signalled host has decided the stop in the job's store: a rank learns of
    a peer's stop at its next batch end, so a batch it began before the decision delays the stop by that batch."""

    def __init__(
        self,
        step: int = 2,
        validation: bool = False,
        node_rank: int | None = None,
        grace_s: float | None = None,
        batch_s: float = 0,
    ):
        """step: the global step; validation: during the validation at that step (its first batch) rather than
        before the step; node_rank: only that host (the others as if their SIGTERM had not arrived yet); grace_s:
        SIGKILL to the host's processes that long after the SIGTERM; batch_s: the seconds each later batch of that
        validation takes, on every host."""
        self.step, self.validation, self.node_rank, self.done = step, validation, node_rank, False
        self.grace_s, self.batch_s = grace_s, batch_s

    def _stop(self, trainer) -> None:
        if self.node_rank not in (None, trainer.node_rank):
            return
        if not self.done and trainer.local_rank == 0 and trainer.global_step == self.step:
            self.done = True
            pid1 = entrypoint()
            os.kill(pid1, signal.SIGTERM)
            if self.grace_s is not None:
                reaper = [sys.executable, proctree.__file__, str(pid1), str(self.grace_s)]
                subprocess.Popen(reaper, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            # the stop lands in this step or batch: wait until PID 1 has passed it on and this process took it
            deadline = time.monotonic() + 30
            while not (trainer.received_sigterm or any(getattr(c, "pending", False) for c in trainer.callbacks)):
                assert time.monotonic() < deadline, "the SIGTERM did not reach the trainer within 30 s"
                time.sleep(0.01)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if not self.validation:
            self._stop(trainer)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if self.validation and not trainer.sanity_checking:
            self._stop(trainer)
            if batch_idx > 0 and trainer.global_step == self.step:
                time.sleep(self.batch_s)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if self.node_rank in (None, trainer.node_rank) or trainer.sanity_checking:
            return
        if self.validation and batch_idx == 0 and trainer.global_step == self.step:
            stop = next(c for c in trainer.callbacks if hasattr(c, "store"))  # the runtime's StopTogether
            deadline = time.monotonic() + 30
            while not stop.store.check([stop.key]):  # the validation's decision, written by the signalled rank
                assert time.monotonic() < deadline, "the signalled host decided no stop within 30 s"
                time.sleep(0.01)


class FailCheckpointRead(pl.Callback):
    """On one host, the first read of a checkpoint fails as S3 throttling or a dropped connection does (an OSError),
    once. Made with the trainer's callbacks, before any checkpoint is read."""

    def __init__(self, node_rank: int = 1):
        if int(os.environ.get("NODE_RANK", "0")) != node_rank:
            return
        load = torch.load

        def failing_once(f, *args, **kwargs):
            if str(getattr(f, "path", f)).endswith(".ckpt"):  # a path, or fsspec's file object
                torch.load = load
                raise OSError(errno.EIO, "injected: this host's first checkpoint read fails")
            return load(f, *args, **kwargs)

        torch.load = failing_once

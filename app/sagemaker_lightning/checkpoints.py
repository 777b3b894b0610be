"""Checkpoints a restarted job resumes from: last.ckpt every N steps, at each epoch end and on SIGTERM, written
atomically, with the random-number states.

SageMaker syncs /opt/ml/checkpoints to checkpoint_s3_uri and restores it on a restarted (spot) job; the runtime's
LightningCLI resumes from last.ckpt there (cli.py).

    python app/example/train.py ... --checkpoint.dirpath ckpts --last_checkpoint_every_n_steps 50
"""

import os
import random
import time

import numpy as np
import torch

from sagemaker_lightning import sharding
from sagemaker_lightning.callbacks import say
from sagemaker_lightning.flavor import attribute


class AtomicCheckpointIO:
    """Each checkpoint goes to a temporary name first and is renamed when complete: a kill during a save never
    leaves a broken file under the real name (remote paths are written as Lightning writes them)."""

    BASE = "plugins.io.TorchCheckpointIO"

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        path = str(path)
        if "://" in path:
            return super().save_checkpoint(checkpoint, path, storage_options)
        partial = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.partial")
        try:
            super().save_checkpoint(checkpoint, partial, storage_options)
        except BaseException:
            if os.path.exists(partial):
                os.remove(partial)
            raise
        os.replace(partial, path)


def rng_states() -> dict:
    """Tensors and plain values only: Lightning loads checkpoints with torch.load(weights_only=True)."""
    kind, keys, position, has_gauss, gauss = np.random.get_state()
    states = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(keys.copy()), position, has_gauss, gauss],
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    kind, keys, position, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, keys.numpy(), position, has_gauss, gauss))
    random.setstate(states["python"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


AUTO_INTERVAL_S = 60  # where no SIGTERM arrives: last.ckpt about this often, so a stop loses about a minute at most
MEASURED_STEPS = 3  # steps timed (after the first, which compiles and warms up) to choose that interval


def interval_steps(seconds_per_step: float, target_s: float = AUTO_INTERVAL_S) -> int:
    """Optimizer steps in about `target_s` seconds of training, at least 1."""
    return max(1, round(target_s / max(seconds_per_step, 1e-9)))


class LastCheckpoint:
    """last.ckpt, what a restarted job resumes from: every `every_n_steps` optimizer steps, at each epoch end, and
    when SageMaker stops the job (SIGTERM on StopTrainingJob or spot interruption: Lightning stops every rank at the
    same step boundary, where they save it together). With the random-number states, restored at the first resumed
    step, a resumed run continues as the uninterrupted one would.

    Where SIGTERM cannot reach the training processes (`unprotected` says why: PID 1 is not the image's entrypoint,
    as under SDK 3.x's driver), a stop kills them without warning: every_n_steps=None then means about every
    AUTO_INTERVAL_S of training, the steps counted from the measured step time, and rank 0 says what bounds the loss."""

    BASE = "callbacks.Callback"

    def __init__(self, every_n_steps: int | None, checkpoint, unprotected: str | None = None):
        """every_n_steps: 0 for epoch ends and SIGTERM only; None: 0, or about a minute where `unprotected`.
        checkpoint: the ModelCheckpoint whose directory (its dirpath, once set up) holds last.ckpt."""
        self.every_n_steps = every_n_steps if every_n_steps is not None or unprotected else 0
        self.checkpoint, self.unprotected = checkpoint, unprotected
        self._saved_step = -1
        self._rng_to_restore = None
        self._timing = None  # (first step timed, its clock) while the interval is being measured

    def save(self, trainer) -> str:
        path = os.path.join(self.checkpoint.dirpath, "last.ckpt")
        with sharding.sharded_saves(trainer.strategy):  # fsdp: a folder of one file per rank (sharding.py)
            trainer.save_checkpoint(path, weights_only=False)  # every rank calls it; rank 0 writes (atomically)
        self._saved_step = trainer.global_step
        if trainer.is_global_zero:
            say(f"saved last.ckpt at epoch {trainer.current_epoch} step {trainer.global_step}")
        return path

    def setup(self, trainer, pl_module, stage):
        # last among the callbacks, after every ModelCheckpoint: its on_validation_end must see their new best. A new
        # list, not an in-place move: Lightning is iterating over the old one to call this hook
        trainer.callbacks = [c for c in trainer.callbacks if c is not self] + [self]

    def on_validation_end(self, trainer, pl_module):
        # saved at this step before this validation: that last.ckpt names the best checkpoint as it was, which
        # ModelCheckpoint may just have replaced and deleted; a run resumed from it would export a missing file
        if trainer.global_step == self._saved_step and not trainer.sanity_checking:
            self.save(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if self.every_n_steps is None:
            self._measure(trainer, step)
        if self.every_n_steps and step % self.every_n_steps == 0 and step != self._saved_step:
            self.save(trainer)

    def _measure(self, trainer, step: int) -> None:
        """Time MEASURED_STEPS steps after the first; rank 0's interval, the same on every rank (a broadcast)."""
        if self._timing is None:
            self._timing = (step, time.monotonic())
        elif step - self._timing[0] >= MEASURED_STEPS:
            n = interval_steps((time.monotonic() - self._timing[1]) / (step - self._timing[0]))
            self.every_n_steps = trainer.strategy.broadcast(n, src=0)
            self._announce(
                trainer, f"last.ckpt every {self.every_n_steps} steps (about {AUTO_INTERVAL_S} s of training)"
            )

    def _announce(self, trainer, bound: str) -> None:
        if trainer.is_global_zero:
            say(
                f"no SIGTERM reaches the training processes ({self.unprotected}): a stop (spot interruption, "
                f"StopTrainingJob) loses what was trained since the last checkpoint; {bound} bounds it "
                "(last_checkpoint_every_n_steps sets another interval)"
            )

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.global_step != self._saved_step:
            self.save(trainer)

    def on_exception(self, trainer, pl_module, exception):
        if isinstance(exception, attribute(self.pl, "utilities.exceptions.SIGTERMException")):
            self.save(trainer)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        checkpoint["rng_states"] = rng_states()

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        self._rng_to_restore = checkpoint.get("rng_states")
        self._saved_step = checkpoint["global_step"]
        if trainer.is_global_zero:
            say(f"resuming at epoch {checkpoint['epoch']} step {checkpoint['global_step']} from last.ckpt")

    def on_train_start(self, trainer, pl_module):
        if self.unprotected and self.every_n_steps is not None:
            self._announce(
                trainer,
                f"last.ckpt every {self.every_n_steps} steps"
                if self.every_n_steps
                else "last.ckpt at each epoch's end",
            )
        if self._rng_to_restore is not None:  # here, not at load: setting up the data since then drew random numbers
            set_rng_states(self._rng_to_restore)
            self._rng_to_restore = None


def resume_path(dirpath: str) -> str | None:
    """The checkpoint a (re)started job resumes from: last.ckpt in the checkpoint directory, when there is one."""
    path = os.path.join(dirpath, "last.ckpt")
    return path if os.path.isfile(path) else None

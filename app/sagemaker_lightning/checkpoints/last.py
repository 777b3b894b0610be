"""Checkpoints a restarted job resumes from: last.ckpt every N steps, at each epoch end and on SIGTERM, written
in the background and atomically, its predecessor kept beside it (writer.py).

SageMaker syncs /opt/ml/checkpoints (or the job's checkpoint_local_path) to checkpoint_s3_uri in the background (a
file deleted here is deleted there too) and restores it on a restarted (spot) job; the runtime's LightningCLI resumes
from last.ckpt there, or from the newest checkpoint that can be resumed from when last.ckpt cannot (resume.py).
checkpoint.dirpath may be an s3:// URL as well. Its predecessor is kept as retention.py says.

The callback holds the hooks; the rules they apply are modules of their own: when last.ckpt is due by steps
(interval.py), a save against the fit's validation (validation.py), ModelCheckpoint's state on resume confined to its
dirpath (confine.py).

    python app/example/train.py ... --checkpoint.dirpath ckpts --last_checkpoint_every_n_steps 50
"""

import contextlib
import functools
import os
import time

from sagemaker_lightning import lines
from sagemaker_lightning.checkpoints.atomic import clear_partials
from sagemaker_lightning.checkpoints.confine import confine
from sagemaker_lightning.checkpoints.interval import Interval
from sagemaker_lightning.checkpoints.layout import LAST, sharding
from sagemaker_lightning.checkpoints.validation import validation_follows, validation_not_run
from sagemaker_lightning.lines import say
from sagemaker_lightning.stop import restarts
from sagemaker_lightning.toolbox.lightning_package import attribute


class LastCheckpoint:
    """last.ckpt, what a restarted job resumes from: every `every_n_steps` optimizer steps, at each epoch end, and
    when SageMaker stops the job (SIGTERM on StopTrainingJob or spot interruption: Lightning stops every rank at the
    same step boundary, where they save it together). The training loader's state in it (data/resumable.py) makes a
    resumed run continue as the uninterrupted one would. A save due at a step that a validation follows is made after
    that validation, and a stop's save inside one as if it had not begun (validation.py): either way the resumed
    run runs each validation the uninterrupted one ran.

    Where SIGTERM cannot reach the training processes (`unprotected` says why: PID 1 is not the image's entrypoint,
    as under SDK 3.x's driver), a stop kills them without warning: every_n_steps=None then means about every
    AUTO_INTERVAL_S of training, the steps counted from the measured step time, and rank 0 says what bounds the loss
    (interval.py)."""

    BASE = "callbacks.Callback"
    clock = staticmethod(time.monotonic)  # a save's time, against the stop's grace

    def __init__(
        self,
        every_n_steps: int | None,
        checkpoint,
        *,
        unprotected: str | None = None,
        resume_point=None,
        grace_s=None,
        ledger=None,
        io=None,
    ):
        """every_n_steps: 0 for epoch ends and SIGTERM only; None: 0, or about a minute where `unprotected`.
        checkpoint: the ModelCheckpoint whose directory (its dirpath, once set up) holds last.ckpt; resume_point:
        what the job resumes from (resume.ResumePoint), named when it does; grace_s: a stop's grace, which the
        first save's time, its write waited for, is compared with (restarts.grace_line); ledger: the attempt's
        goodput.Ledger, where a save is the training's stall; io: the BackgroundCheckpointIO, whose writer says each
        last.ckpt once it is there (io.announce, every step), None where saves are synchronous."""
        self.interval = Interval(every_n_steps, unprotected)
        self.checkpoint, self.resume_point = checkpoint, resume_point
        self.grace_s = grace_s
        self.timing = ledger.timing if ledger else (lambda term: contextlib.nullcontext())
        self.io = io  # None: a save is complete when trainer.save_checkpoint returns
        self._saved_step = -1
        self._after_validation = False  # a save due at a step a validation follows: made after it

    def save(self, trainer, stop: bool = False) -> str:
        """last.ckpt now; written before it returns on a stop, and the first time (measured against the grace)."""
        path = os.path.join(self.checkpoint.dirpath, LAST)
        started = self.clock()
        with self.timing("checkpoint stall"):
            sharded = trainer.strategy.sharded_state() if sharding(trainer.strategy) else contextlib.nullcontext()
            with sharded:  # fsdp: a folder of one file per rank (parallel/fsdp.py)
                trainer.save_checkpoint(path, weights_only=False)  # every rank calls it; rank 0 writes (atomically)
            if self.io and (stop or self.grace_s):
                self.io.wait()
        self._saved_step = trainer.global_step
        if trainer.is_global_zero:
            if not self.io:  # complete here; else the writer says it once written
                say(lines.saved(trainer.current_epoch, trainer.global_step))
            if self.grace_s and (late := restarts.grace_line(self.clock() - started, self.grace_s)):
                say(late)  # the first save's only: each later one would say the same
        self.grace_s = None
        return path

    def setup(self, trainer, pl_module, stage):
        if self.io and stage == "fit":  # another fit of the trainer: saves in the background again, as in its first
            self.io.open()
        if trainer.is_global_zero and stage == "fit" and self.checkpoint.dirpath:
            clear_partials(self.checkpoint.dirpath)  # global rank 0 writes every file that has one
        asked = self.checkpoint.save_last  # ModelCheckpoint's own last.ckpt: a second whole file (last-v1.ckpt)
        if asked:
            self.checkpoint.save_last = None
            if trainer.is_global_zero:
                say(
                    f"checkpoint.save_last={asked} is not needed: the runtime writes last.ckpt itself "
                    "(every last_checkpoint_every_n_steps steps, at each epoch's end, on SIGTERM); ModelCheckpoint's "
                    "own copy is turned off"
                )
        # its place in the callbacks, after every ModelCheckpoint (the hub puts it there: toolbox/concern.py), makes its
        # on_validation_end see their new best
        # a ModelCheckpoint's top-k update at an epoch's end (validation once an epoch) comes after this callback's
        # on_train_epoch_end: Lightning calls "monitoring" callbacks' hooks after every other's. The last.ckpt saved
        # there did not hold it: a run resumed from it forgot the best checkpoint (it exported the final weights, and
        # kept the file the best should have replaced). Its hook, then this save where it changed the state
        for callback in self._model_checkpoints(trainer):
            hook = type(callback).on_train_epoch_end.__get__(callback)  # the class's: a second fit wraps it once
            callback.on_train_epoch_end = functools.partial(self._top_k_then_save, callback, hook)
            if self.io:
                exists = type(callback).file_exists.__get__(callback)
                callback.file_exists = functools.partial(self._written_then_exists, exists)

    def _written_then_exists(self, exists, filepath, trainer) -> bool:
        # ModelCheckpoint's version counter asks whether a name is taken before it saves: a file still being written
        # is (it wrote the next best over it). The wait costs nothing the save after it would not wait for: at most
        # one save is in flight
        self.io.wait()
        return exists(filepath, trainer)

    def _top_k_then_save(self, callback, hook, trainer, pl_module):
        chosen = (callback.best_model_path, list(callback.best_k_models))
        hook(trainer, pl_module)
        if trainer.global_step == self._saved_step and chosen != (
            callback.best_model_path,
            list(callback.best_k_models),
        ):
            self.save(trainer)

    def on_train_start(self, trainer, pl_module):
        if trainer.is_global_zero and (line := self.interval.line()):
            say(line)

    def step_end(self, trainer, step, outputs, batch):  # toolbox/concern.py's Steps calls it
        if self.io:
            self.io.announce()
        interval = self.interval
        if interval.steps is None:  # rank 0's measured interval, the same on every rank
            agreed = functools.partial(trainer.strategy.broadcast, src=0)
            if interval.measure(step, time.monotonic(), agreed) and trainer.is_global_zero:
                say(interval.line(measured=True))
        if interval.due(step) and step != self._saved_step:
            # before a validation that follows this step, Lightning would count that validation as run: a run resumed
            # from it would skip it
            self._after_validation = validation_follows(trainer)
            if not self._after_validation:
                self.save(trainer)

    def on_validation_end(self, trainer, pl_module):
        # saved at this step before this validation: that last.ckpt names the best checkpoint as it was, which
        # ModelCheckpoint may just have replaced and deleted; a run resumed from it would export a missing file
        if (trainer.global_step == self._saved_step or self._after_validation) and not trainer.sanity_checking:
            self._after_validation = False
            self.save(trainer)

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.global_step != self._saved_step:
            self.save(trainer)

    def on_exception(self, trainer, pl_module, exception):
        # not in the sanity check: nothing was trained since the start or the checkpoint it resumed from
        stopped = isinstance(exception, attribute(self.pl, "utilities.exceptions.SIGTERMException"))
        if stopped and not trainer.sanity_checking:
            with validation_not_run(trainer):  # a validation the stop cut short runs again, whole, on resume
                self.save(trainer, stop=True)  # after the save in flight, within the grace

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        # before any callback's load_state_dict (Lightning calls every on_load_checkpoint first)
        self._saved_step = checkpoint["global_step"]
        confine(checkpoint, self._model_checkpoints(trainer), announce=trainer.is_global_zero)
        if trainer.is_global_zero:
            chosen = self.resume_point.chosen if self.resume_point else None
            path = str(chosen or trainer.ckpt_path).rstrip("/")
            name = os.path.basename(path)
            if os.path.basename(os.path.dirname(path)) == LAST:  # fsdp: a sharded save inside last.ckpt/
                name = LAST
            say(f"resuming at epoch {checkpoint['epoch']} step {checkpoint['global_step']} from {name}")

    def _model_checkpoints(self, trainer) -> list:
        model_checkpoint = attribute(self.pl, "callbacks.ModelCheckpoint")
        return [c for c in trainer.callbacks if isinstance(c, model_checkpoint)]

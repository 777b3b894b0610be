"""Goodput's callback (the ledger and the line: goodput.py): it keeps global rank 0's timeline of the fit in the
attempt's Ledger, step by step, writes the ledger beside the checkpoints (goodput_file.py) and carries the earlier
attempts' records in each checkpoint. Its two hooks a step cost 13.5 µs a step with Lightning's profiler's own few µs
a hook (scripts/bench_overhead.py --profile, 1 process, 2 AMD EPYC cores, torch 2.14.1).

    python -c "from sagemaker_lightning import goodput_callback; print(goodput_callback.Goodput.__doc__)"
"""

import time

from sagemaker_lightning import goodput_file
from sagemaker_lightning.goodput import STATE_KEY, Attempt
from sagemaker_lightning.lines import say
from sagemaker_lightning.toolbox.concern import Context, Part
from sagemaker_lightning.toolbox.lightning_package import made


class Goodput:
    """The callback that keeps the Attempt's timeline, on global rank 0; the line at the fit's end."""

    BASE = "callbacks.Callback"
    clock = staticmethod(time.monotonic)

    def __init__(self, attempt: Attempt):
        self.attempt, self.ledger = attempt, attempt.ledger
        self.on, self._saved = False, []
        self._last_end = None  # the previous step's end (clock), None before this attempt's first step
        self._since = 0.0  # the ledger's accounted seconds at the last mark
        self._written = -goodput_file.EVERY_S
        self.writes = goodput_file.Writes()
        self._starting = None  # the event that ends the start-up's writes (setup to the first step)

    def setup(self, trainer, pl_module, stage):
        self.on = stage == "fit" and trainer.is_global_zero
        # the dirpath ModelCheckpoint was given: its setup comes after this one (the hub's order, which puts this
        # callback after it, holds from the next hook on: toolbox/concern.CallbackOrder)
        if self.on and (folder := self.attempt.where()):
            # the ledger's records are this attempt's predecessors until a resumed checkpoint says which
            # (on_train_start); this attempt's record is written with them from now until its first step, so that one
            # killed while it starts (a long restore, a host lost) leaves its time too
            self.attempt.known = goodput_file.read(folder)
            self.attempt.before = list(self.attempt.known or [])
            self._starting = self.writes.every(goodput_file.STARTING_EVERY_S, folder, self.attempt.records)

    def _started(self) -> None:
        """The start-up's writes end (the first step, a failure before it, the teardown), without waiting for one in
        flight (an S3 put that hangs holds no step)."""
        if self._starting:
            self._starting.set()
            self._starting = None

    @property
    def state_key(self) -> str:
        """Lightning's default (the class's name), named in goodput.py: the checkpoint writer leaves it out where it
        compares two saves of one moment (checkpoints/writer.py)."""
        return STATE_KEY

    def state_dict(self) -> dict:
        return {"records": self.attempt.records()}

    def load_state_dict(self, state_dict: dict) -> None:
        self._saved = state_dict.get("records") or []  # checked where they are used, on global rank 0

    def on_train_start(self, trainer, pl_module):
        if self.on:
            saved = goodput_file.checked(self._saved, "the goodput records of the checkpoint resumed from") or []
            self.attempt.resumed(saved, trainer.global_step, self.attempt.known)

    def on_validation_start(self, trainer, pl_module):
        self._validation = (self.clock(), self.ledger.accounted())

    def on_validation_end(self, trainer, pl_module):
        if self.on:  # less what is accounted inside it: the saves that follow a validation's new best
            start, accounted = self._validation
            self.ledger.spent("validation", self.clock() - start - (self.ledger.accounted() - accounted))

    def step_start(self, trainer, batch_idx):  # toolbox/concern.py's Steps calls it, and step_end
        if not self.on:
            return
        now, ledger = self.clock(), self.ledger
        if self._last_end is None:  # everything accounted so far happened inside the start-up
            self._started()
            self.attempt.training = True
            ledger.spent("start-up", self.attempt.wall() - self.attempt.start - ledger.total)
        else:
            ledger.spent("data wait", now - self._last_end - (ledger.total - self._since))
        self._step_start, self._since = now, ledger.total

    def step_end(self, trainer, step, outputs, batch):
        if not self.on:
            return
        now, ledger, attempt = self.clock(), self.ledger, self.attempt
        spent = now - self._step_start - (ledger.total - self._since)
        if step > attempt.again_until:
            ledger.spent("training", spent)
        else:
            ledger.spent("steps trained again", spent)
            ledger.steps_again += 1
        attempt.step = step
        self._last_end, self._since = now, ledger.total
        if now - self._written >= goodput_file.EVERY_S:
            self._written = now
            self._write()

    def _write(self) -> None:
        if folder := self.attempt.where():
            self.writes.write(folder, self.attempt.records())

    def _finish(self, trainer) -> None:
        """The end term (the rest of this attempt's time since its last accounted moment), the ledger written, the
        figures to the logger."""
        # the wall time stops with the end term: the line, the run's figures and a failure's line, said at moments a
        # while apart under load, give the same figures, and the terms add up to the wall time
        self.attempt.ended = self.attempt.wall()
        self.ledger.spent("end", self.attempt.ended - self.attempt.start - self.ledger.accounted())
        self.writes.check(wait=True)  # the write in flight: the one after it holds every record
        self._write()
        self.writes.check(wait=True)
        if trainer.logger is not None:
            trainer.logger.log_metrics(self.attempt.figures(), trainer.global_step)

    def on_fit_end(self, trainer, pl_module):
        if self.on and self._last_end is not None:
            self._finish(trainer)
            if not self.attempt.deferred:
                say(self.attempt.line())

    def on_exception(self, trainer, pl_module, exception):
        if not self.on:
            return
        if self._last_end is not None:
            self._finish(trainer)
        elif self._starting:  # failed while it started: its record as far as it got
            self._started()
            self.writes.check(wait=True)
            self._write()
            self.writes.check(wait=True)

    def teardown(self, trainer, pl_module, stage):
        self._started()  # a fit that never stepped (max_steps=0)


def concern(ctx: Context) -> Part:
    """Goodput in a job, after every checkpoint callback (a stop's save is accounted) and before the MLflow run's end
    (which logs its figures): toolbox/concern.py."""
    return Part(after_checkpoints=[made(Goodput, ctx.pl)(ctx.goodput)] if ctx.plan.in_job else [])

"""Every rank stops at the same step on SIGTERM, whichever host it reached first (StopTogether); how a stop reaches
the training processes at all: signals.py. docs/reliability.md records why Lightning's own handler is replaced.

    python -m pytest tests/unit/stop/test_per_step.py     # two real gloo processes, signalled at different steps and in
                                                     # validations of different lengths
"""

import atexit
import contextlib
import itertools
import time

import torch

from sagemaker_lightning.toolbox import lightning_package
from sagemaker_lightning.toolbox.concern import Context, Part

STOP, DONE = "stop", "done"  # a validation's decision: every rank stops in it; every rank ran its last batch
PREFIX = "sagemaker_lightning/stop/"  # the validations' keys in the job's store
_validations = itertools.count()  # every rank runs the same validations, in each fit of the process: their number
# names each one's keys


class StopTogether:
    """Every rank stops at the same step when SIGTERM reaches the hosts at different moments: Lightning's handler is
    replaced by one that only notes the signal, and the ranks agree (any rank signalled → all stop) in one all-reduce
    at agreed steps about AGREE_EVERY_S of training apart, at the end of each validation, after each epoch's end
    hooks and before a fit's first epoch, so that a stop signalled at an epoch's end (or while a resumed run
    restores) stops before the next epoch starts (its loaders, on_train_epoch_start), in the state a lone process
    stops in at an epoch's end. In a validation, whose
    ranks may run different numbers of batches (an IterableDataset, a loader of the project's own), no collective
    could pair: the job's store decides each validation once (STOP or DONE, the first written wins), and a rank
    looks at it at every batch's end, so a stop decided before that end is seen there, however long the next batch.
    Why, and what it costs: docs/reliability.md, "The stop agreement". A lone process stops as Lightning stops it."""

    BASE = "callbacks.Callback"
    AGREE_EVERY_S = 0.25  # seconds of training steps from one agreement to the next: a stop's delay at most
    MOST_STEPS = 100  # between two agreements: a pace that drops after one (a data stall) delays a stop so many steps
    # A validating rank looks at the store at every batch's end: one round trip, 17 us on loopback (TCPStore.check,
    # torch 2.14.1, 2 EPYC cores). Looking at most every 0.25 s let a stop decided just before a batch's end wait for
    # the whole next batch: one that outlasted the grace lost the signalled peer to SIGKILL.
    MOST_WAIT_S = 0.25  # at most between a waiting rank's looks
    LEAVE_WAIT_S = 10  # global rank 0, at a stop decided in a validation: for every rank to have read it (a peer's
    # batch in progress, which is far shorter in any job that stops within SageMaker's 120 s grace)
    FIRST_WAIT_S = 0.001  # a waiting rank looks again after this, then after twice as long each time: it waits for
    # its peers at most about as long again
    clock = staticmethod(time.monotonic)

    def setup(self, trainer, pl_module, stage):
        self.pending = None if trainer.world_size == 1 else False  # None: Lightning's own handler, no peer to pair with
        self._between_epochs(trainer)
        if self.pending is None:
            return
        self.every, self.countdown, self.since = 1, 1, None  # the first step agrees, and times the next ones

        def note(signum, frame):
            if not self.pending:  # Lightning's process launcher's children get it too, as in Lightning's own
                self.pending = True
                if trainer.strategy.launcher is not None:
                    trainer.strategy.launcher.kill(signum)

        trainer._signal_connector._sigterm_notifier_fn = note  # read when fit() registers its handlers, after setup

        def before_step():  # in place of Lightning's: every rank runs it at the start of each training step
            self.countdown -= 1
            if self.countdown > 0:
                return
            now = self.clock()
            # this rank's proposal: the steps that take AGREE_EVERY_S at its pace since the last agreement
            proposal = 1 if self.since is None else int(self.AGREE_EVERY_S * self.every / max(now - self.since, 1e-6))
            self.since = now
            self.every = self.agree(trainer, min(max(proposal, 1), self.MOST_STEPS))
            if trainer._signal_connector.received_sigterm:
                raise self.stopped
            self.countdown = self.every

        trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = before_step

    @property
    def stopped(self) -> type:
        """What stops every rank: Lightning's SIGTERMException, whose handling saves last.ckpt (checkpoints/last.py)."""
        return lightning_package.attribute(self.pl, "utilities.exceptions.SIGTERMException")

    def _between_epochs(self, trainer) -> None:
        """Every rank (a lone process too) agrees after each epoch's end hooks (their last.ckpt included) and before
        a fit's first epoch (after a resumed run's restore and on_train_start hooks), and stops there if signalled:
        in the state a lone process stops in at an epoch's end, the next epoch not begun."""
        fit_loop, started = trainer.fit_loop, []
        loop = type(fit_loop)  # the class's methods: a second fit wraps them once

        def stop_if_agreed():
            self.agree(trainer)
            if trainer._signal_connector.received_sigterm:
                raise self.stopped

        def on_advance_start():
            if not started:
                started.append(True)
                stop_if_agreed()
            loop.on_advance_start(fit_loop)

        def on_advance_end():
            loop.on_advance_end(fit_loop)  # where Lightning raises for a stop agreed before
            stop_if_agreed()

        fit_loop.on_advance_start, fit_loop.on_advance_end = on_advance_start, on_advance_end

    def agree(self, trainer, proposal: int = 1) -> int:
        """Whether any rank has been signalled, as Lightning's received_sigterm on every rank; every rank must call it
        at the same point. Returns the mean of the ranks' `proposal`s, the same number on every rank."""
        connector = trainer._signal_connector
        if self.pending is None or connector.received_sigterm:
            return proposal
        # one all-reduce, as Lightning's broadcast (reduce_boolean_decision adds a barrier before it); SUM, which
        # SMDDP takes too
        sums = torch.tensor([int(self.pending), proposal], device=trainer.strategy.root_device)
        torch.distributed.all_reduce(sums, torch.distributed.ReduceOp.SUM)
        signalled, proposals = sums.tolist()
        connector.received_sigterm = signalled > 0
        return max(proposals // trainer.world_size, 1)

    leaving = False  # global rank 0 waits at exit for its peers to read a stop decided in a validation

    def on_validation_start(self, trainer, pl_module):
        if self.pending is not None:
            # a sharded model's validation step gathers its weights on every rank, a collective a batch: the ranks run
            # the same batches, and one all-reduce at each batch's end stops them at the same one (a rank that stopped
            # a batch before its peers, as the store lets it, left them waiting in the gather for dist_timeout)
            self.paired = isinstance(trainer.strategy, tuple(self._sharded()))
            self.key, self.arrived = f"{PREFIX}{next(_validations)}", self.paired
            self.store = torch.distributed.distributed_c10d._get_default_store()  # torch's own: its rendezvous's

    def _sharded(self):
        for name in ("strategies.ModelParallelStrategy", "strategies.FSDPStrategy"):
            yield lightning_package.attribute(self.pl, name)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if self.pending is None:
            return
        if self.paired:
            self.agree(trainer)  # Lightning's evaluation loop stops after this batch once received_sigterm is set
            return
        if trainer._evaluation_loop.batch_progress.is_last_batch:
            self._arrive(trainer)
            return
        # the first signalled rank decides STOP; a DONE (every rank past its last batch) comes too late for it
        said = self.store.compare_set(self.key, "", STOP) if self.pending else self._said()
        if said == STOP.encode():
            self._stopping(trainer)  # Lightning's evaluation loop stops after this batch once received_sigterm is set

    def on_validation_epoch_end(self, trainer, pl_module):
        if self.pending is not None and not self.arrived:  # a step that takes the loader's iterator: no last batch
            self._arrive(trainer)

    def on_validation_end(self, trainer, pl_module):
        self.agree(trainer)  # DONE: every rank is here; a signal since is agreed on at once

    def _said(self) -> bytes:
        return self.store.get(self.key) if self.store.check([self.key]) else b""

    def _arrive(self, trainer) -> None:
        """This rank ran its validation's last batch: it waits until every rank has (DONE) or a rank is signalled
        (STOP: then every rank stops in the validation, this one here, where a peer still validating stops too, after
        its batch); a peer that never arrives, for the store's timeout (then DONE: the next collective names it)."""
        self.arrived, wait = True, self.FIRST_WAIT_S
        if self.store.add(self.key + "/arrived", 1) == trainer.world_size:
            self.store.compare_set(self.key, "", DONE)
        deadline = self.clock() + self.store.timeout.total_seconds()
        while not self.store.check([self.key]):
            if self.pending or self.clock() > deadline:
                self.store.compare_set(self.key, "", STOP if self.pending else DONE)
            else:
                time.sleep(wait)
                wait = min(2 * wait, self.MOST_WAIT_S)
        if self.store.get(self.key) == STOP.encode():
            self._stopping(trainer)
            raise self.stopped  # Lightning's own stops not here

    def _stopping(self, trainer) -> None:
        """This rank stops in a validation the store decided STOP, and says it read the decision; global rank 0, whose
        process may hold the store, waits as it exits until every rank has (a rank that looked after it left failed on
        the lost store, exit 1, instead of stopping), at most LEAVE_WAIT_S."""
        trainer._signal_connector.received_sigterm = True
        if trainer.global_rank:
            with contextlib.suppress(Exception):  # the store gone: this rank stops all the same
                self.store.add(self.key + "/read", 1)
        elif not self.leaving:
            self.leaving = True
            atexit.register(_read_by_peers, self.store, self.key + "/read", trainer.world_size - 1)


def _read_by_peers(store, key: str, peers: int) -> None:
    deadline = time.monotonic() + StopTogether.LEAVE_WAIT_S
    with contextlib.suppress(Exception):
        while store.add(key, 0) < peers and time.monotonic() < deadline:
            time.sleep(0.01)


def concern(ctx: Context) -> Part:
    """StopTogether, in a job (elsewhere a stop is Lightning's own)."""
    return Part(callbacks=[lightning_package.made(StopTogether, ctx.pl)()] if ctx.plan.in_job else [])

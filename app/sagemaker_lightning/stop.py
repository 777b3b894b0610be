"""Every rank stops at the same step on SIGTERM, whichever host it reached first (StopTogether); how a stop reaches
the training processes at all: signals.py. docs/reliability.md records why Lightning's own handler is replaced.

    python -m pytest tests/unit/test_per_step.py     # two real gloo processes, signalled at different steps
"""

import time

import torch

from sagemaker_lightning import flavor


class StopTogether:
    """Every rank stops at the same step when SIGTERM reaches the hosts at different moments: Lightning's handler is
    replaced by one that only notes the signal, and the ranks agree (any rank signalled → all stop) in one all-reduce
    at agreed steps about AGREE_EVERY_S of training apart, and after each validation batch. Why, and what it costs:
    docs/reliability.md, "The stop agreement". A lone process stops as Lightning stops it."""

    BASE = "callbacks.Callback"
    AGREE_EVERY_S = 0.25  # seconds of training steps from one agreement to the next: a stop's delay at most
    MOST_STEPS = 100  # between two agreements: a pace that drops after one (a data stall) delays a stop so many steps
    clock = staticmethod(time.monotonic)

    def setup(self, trainer, pl_module, stage):
        self.pending = None  # a lone process: Lightning's own handler, which has no peer to pair with
        if trainer.world_size == 1:
            return
        self.pending = False
        self.every, self.countdown, self.since = 1, 1, None  # the first step agrees, and times the next ones

        def note(signum, frame):
            if not self.pending:  # Lightning's process launcher's children get it too, as in Lightning's own
                self.pending = True
                if trainer.strategy.launcher is not None:
                    trainer.strategy.launcher.kill(signum)

        trainer._signal_connector._sigterm_notifier_fn = note  # read when fit() registers its handlers, after setup
        stopped = flavor.attribute(self.pl, "utilities.exceptions.SIGTERMException")

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
                raise stopped
            self.countdown = self.every

        trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = before_step

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

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.agree(trainer)  # Lightning's evaluation loop stops after this batch once received_sigterm is set


def callbacks(pl, plan) -> list:
    """StopTogether, on SageMaker (elsewhere a stop is Lightning's own)."""
    return [flavor.made(StopTogether, pl)()] if plan.on_sagemaker else []

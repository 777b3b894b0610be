"""How a stop reaches the training processes. SageMaker signals only PID 1 on StopTrainingJob and spot interruption
(SIGTERM, then SIGKILL 120 s later). The image's entrypoint (PID 1) passes SIGTERM on to every training process that
registered here — not to launchers (mpirun, torchrun, the toolkit), which could end the ranks before their checkpoint
is written, and not to DataLoader workers, which die of it. Where PID 1 is something else (SDK 3.x's driver runs
`bash sm_train.sh` as PID 1, which ignores SIGTERM), no stop ever arrives: the runtime says so and checkpoints by
steps instead (checkpoints.LastCheckpoint).

    python -c "from sagemaker_lightning import signals; print(signals.registered(), signals.pid1())"
"""

import os
import time

from sagemaker_lightning import flavor

RUN_DIR = os.environ.get("SAGEMAKER_LIGHTNING_RUN_DIR", "/tmp/sagemaker-lightning")  # shared by PID 1 and the trainers
ENTRYPOINT = "sagemaker_lightning.entrypoint"  # how PID 1 shows in /proc/1/cmdline when it is the image's


def register(pid: int) -> None:
    """Ask PID 1 for SIGTERM: `pid` trains and checkpoints on it."""
    os.makedirs(os.path.join(RUN_DIR, "trainers"), exist_ok=True)
    open(os.path.join(RUN_DIR, "trainers", str(pid)), "w").close()


def registered() -> list[int]:
    """The registered training processes that still run."""
    try:
        names = os.listdir(os.path.join(RUN_DIR, "trainers"))
    except FileNotFoundError:
        return []
    return [int(n) for n in names if n.isdigit() and os.path.exists(f"/proc/{n}")]


def pid1() -> str:
    """PID 1's command line, as /proc shows it ('' when it cannot be read)."""
    try:
        with open("/proc/1/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def forwarded() -> bool:
    """Whether a SIGTERM sent to the container reaches this process: PID 1 is the image's entrypoint."""
    return ENTRYPOINT in pid1()


def why_unreached() -> str:
    """Why a SIGTERM sent to the container does not reach the training processes, in a few words."""
    command = pid1()
    if "sm_train.sh" in command:
        return "PID 1 is SDK 3.x's driver sm_train.sh, which ignores it"
    return (
        f"PID 1 is {command[:60]!r}, not the image's entrypoint" if command else "PID 1 is not the image's entrypoint"
    )


class StopTogether:
    """Every rank stops at the same step when SIGTERM reaches the hosts at different moments (SageMaker signals each
    host's PID 1 on its own). Lightning 2.6's handler broadcasts from inside the signal handler
    (`_SignalConnector._sigterm_notifier_fn`): a rank signalled while its peers are inside another collective (DDP's
    gradient all-reduce, FSDP's all-gathers) pairs that broadcast with the wrong operation, and its process dies
    without a checkpoint (seen with fsdp on two local-mode hosts stopped by `docker stop`, gloo). Here the handler
    only notes the signal, and the ranks agree (any rank signalled → all stop), where Lightning stops them all and
    last.ckpt is saved:
      - training: in place of the collective Lightning itself runs before every step with several ranks
        (`_broadcast_sigterm_tensor`), one all-reduce of every rank's flag, but only at agreed steps, about
        AGREE_EVERY_S of training apart: the ranks agree at each on the step of the next, so a stop comes at most
        that long after its signal, and the steps between run no collective at all. A collective per step kept the
        ranks in lockstep: 0.83× Lightning's steps/s on 2 CPU processes, 1.14× without (scripts/bench_overhead.py);
      - validation batches (sanity checks included): after each, so a validation longer than SageMaker's 120 s
        grace ends after the batch the stop came in, not in SIGKILL. Every rank runs as many validation batches as
        the others (Lightning's distributed sampler pads them to the same count), so the ranks' all-reduces pair.
    A lone process stops as Lightning stops it."""

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
        import torch  # here, not above: PID 1 (the entrypoint) imports this module and never needs torch

        # one all-reduce, as Lightning's broadcast (reduce_boolean_decision adds a barrier before it); SUM, which
        # SMDDP takes too
        sums = torch.tensor([int(self.pending), proposal], device=trainer.strategy.root_device)
        torch.distributed.all_reduce(sums, torch.distributed.ReduceOp.SUM)
        signalled, proposals = sums.tolist()
        connector.received_sigterm = signalled > 0
        return max(proposals // trainer.world_size, 1)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.agree(trainer)  # Lightning's evaluation loop stops after this batch once received_sigterm is set

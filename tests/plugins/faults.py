"""Faults for the tests, added to a job as `trainer.callbacks+=faults.KillRank` (this folder on PYTHONPATH). Made for
whichever Lightning package the project under test imports (the example: pytorch_lightning; the user project:
lightning.pytorch)."""

import os
import signal

from sagemaker_lightning.flavor import package

pl = package()


class KillRank(pl.Callback):
    """SIGKILL one rank at one step: what the kernel's out-of-memory killer does to a process."""

    def __init__(self, rank: int = 1, step: int = 2):
        """rank: the global rank to kill (in a one-process job, the only one); step: at the start of which step."""
        self.rank, self.step = rank, step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        rank = 0 if trainer.world_size == 1 else self.rank  # the only process of a one-process job
        if trainer.global_rank == rank and trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class Terminate(pl.Callback):
    """SIGTERM to every rank at one step, as StopTrainingJob and a spot interruption send it to every host."""

    def __init__(self, step: int = 2):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)

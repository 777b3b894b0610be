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


def entrypoint() -> int:
    """This host's entrypoint (PID 1 in a container): the nearest ancestor running sagemaker_lightning.entrypoint."""
    pid = os.getpid()
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"sagemaker_lightning.entrypoint" in f.read():
                return pid
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])  # the parent
    return 1


class StopJob(pl.Callback):
    """SIGTERM to this host's entrypoint, as SageMaker signals every host's PID 1 on StopTrainingJob and spot
    interruption: at the start of one step, or during the validation after it."""

    def __init__(self, step: int = 2, validation: bool = False, node_rank: int | None = None):
        """step: the global step; validation: during the validation at that step rather than before the step;
        node_rank: only that host (the others as if their SIGTERM had not arrived yet)."""
        self.step, self.validation, self.node_rank, self.done = step, validation, node_rank, False

    def _stop(self, trainer) -> None:
        if self.node_rank not in (None, trainer.node_rank):
            return
        if not self.done and trainer.local_rank == 0 and trainer.global_step == self.step:
            self.done = True
            os.kill(entrypoint(), signal.SIGTERM)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if not self.validation:
            self._stop(trainer)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if self.validation and not trainer.sanity_checking:
            self._stop(trainer)

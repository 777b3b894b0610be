"""sagemaker_lightning: a Lightning project trains on SageMaker, as it is, with one line changed.

    from sagemaker_lightning import LightningCLI   # instead of: from lightning.pytorch.cli import LightningCLI

    LightningCLI(MyModel, MyDataModule)             # same signature and behaviour as Lightning's

In a job (SageMaker, whichever launcher started it: the training toolkit, torchrun, mpirun or SDK 3.x's driver; or
Kubeflow, HyperPod, Slurm, torchrun: launch/platforms/) it spans the job's hosts, resumes from the checkpoint
directory, checkpoints on SIGTERM, writes the best weights to the model directory, and fails with one line naming the
cause. Outside any job it is Lightning's LightningCLI.

Public API: LightningCLI, UserError (raise it for a problem the user can fix: reported as one line, no traceback),
ResumableDataLoader and ResumableEpoch (training data that resumes exactly mid-epoch: data/resumable.py), and
check_source (one line for a streamed dataset's source that litdata cannot read: data/streaming.py).
This module stays light (no torch import): the image's entrypoint and start-up hook import the package
(tests/unit/test_startup.py).
"""

from sagemaker_lightning.failure import UserError

__all__ = ["LightningCLI", "ResumableDataLoader", "ResumableEpoch", "UserError", "check_source"]
HEAVY = {  # each imports torch (and Lightning): only when asked for
    "LightningCLI": "sagemaker_lightning.cli.hub",
    "ResumableDataLoader": "sagemaker_lightning.data.resumable",
    "ResumableEpoch": "sagemaker_lightning.data.resumable",
    "check_source": "sagemaker_lightning.data.streaming",
}


def __getattr__(name: str):
    if name in HEAVY:
        import importlib

        return getattr(importlib.import_module(HEAVY[name]), name)
    raise AttributeError(f"module 'sagemaker_lightning' has no attribute {name!r}")

"""The training loader, wrapped once in a job: whatever the project's train_dataloader() returns, a plain DataLoader
becomes the runtime's resumable one (resumable.py) and litdata's StreamingDataLoader comes prepared (streaming.py), so
that a restarted job trains on exactly the samples the interrupted one had not reached; a loader of the project's own
(one with a state_dict) is left as it is. Outside a job the project's loaders are Lightning's and litdata's own.

    python app/example/train.py ... --checkpoint.dirpath ckpts     # in a job: resumes mid-epoch from last.ckpt
"""

import os

from sagemaker_lightning.cli.concern import Context, Part
from sagemaker_lightning.cli.lightning_package import attribute, made
from sagemaker_lightning.data import decoders
from sagemaker_lightning.data.resumable import resumable
from sagemaker_lightning.data.streaming import StreamingEpochs, is_streaming, prepared


def wrapped(loader, trainer):
    """The one wrapper of the training loader: litdata's prepared, any other made resumable where it can be."""
    return prepared(loader) if is_streaming(loader) else resumable(loader, trainer.global_rank, trainer.world_size)


class TrainingLoader:
    """From a fit's setup on, the train_dataloader() of the data module (or of the model) returns its loader wrapped:
    before Lightning asks for its length or gives it a checkpoint's state. Once, however many fits."""

    BASE = "callbacks.Callback"

    def setup(self, trainer, pl_module, stage):
        owner = trainer.datamodule or pl_module
        overridden = attribute(self.pl, "utilities.model_helpers.is_overridden")
        if stage != "fit" or getattr(owner.train_dataloader, "_wrapped", False):
            return
        if not overridden("train_dataloader", owner):
            return
        provide = owner.train_dataloader

        def train_dataloader():
            return wrapped(provide(), trainer)

        train_dataloader._wrapped = True
        owner.train_dataloader = train_dataloader


def concern(ctx: Context) -> Part:
    """In a job: the training loader wrapped, and a streamed one's epochs kept exact (StreamingEpochs). Anywhere: the
    decoders the project admits for streamed data (decoders.SETTING), handed to every check of the process."""
    decoders.admit(ctx.config.get(decoders.SETTING), os.environ)
    if not ctx.plan.in_job:
        return Part()
    return Part(callbacks=[made(TrainingLoader, ctx.pl)(), made(StreamingEpochs, ctx.pl)(ctx.plan.checkpoint_dir)])

"""The training loader, wrapped once in a job: whatever the project's train_dataloader() returns, a plain DataLoader
becomes the runtime's resumable one (resumable.py) and litdata's StreamingDataLoader comes prepared (streaming.py), so
that a restarted job trains on exactly the samples the interrupted one had not reached; a loader of the project's own
(one with a state_dict) is left as it is. The validation, test and predict loaders that stream come prepared too: no
reader decodes a field with a decoder that can run code (decoders.py). Outside a job the project's loaders are
Lightning's and litdata's own.

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


def streamed(loader, trainer):
    """Any other loader (validation, test, predict): litdata's prepared, so that each of its readers checks the
    decoders of the index it loaded (decoders.py) before it decodes a field, the sanity check's included."""
    return prepared(loader) if is_streaming(loader) else loader


class TrainingLoader:
    """From setup on, the data module's (or the model's) loaders come wrapped: the training loader (wrapped), before
    Lightning asks for its length or gives it a checkpoint's state; every other (streamed). Once, however many fits."""

    BASE = "callbacks.Callback"
    WRAPPED = {"train_dataloader": wrapped, "val_dataloader": streamed, "test_dataloader": streamed}
    WRAPPED["predict_dataloader"] = streamed

    def setup(self, trainer, pl_module, stage):
        owner = trainer.datamodule or pl_module
        overridden = attribute(self.pl, "utilities.model_helpers.is_overridden")
        for name, wrap in self.WRAPPED.items():
            provide = getattr(owner, name, None)
            if provide is None or getattr(provide, "_wrapped", False) or not overridden(name, owner):
                continue

            def loader(provide=provide, wrap=wrap):
                return wrap(provide(), trainer)

            loader._wrapped = True
            setattr(owner, name, loader)


def concern(ctx: Context) -> Part:
    """In a job: the training loader wrapped, and a streamed one's epochs kept exact (StreamingEpochs). Anywhere: the
    decoders the project admits for streamed data (decoders.SETTING), handed to every check of the process."""
    decoders.admit(ctx.config.get(decoders.SETTING), os.environ)
    if not ctx.plan.in_job:
        return Part()
    return Part(callbacks=[made(TrainingLoader, ctx.pl)(), made(StreamingEpochs, ctx.pl)(ctx.plan.checkpoint_dir)])

"""The training loader, wrapped once in a job: whatever the project's train_dataloader() returns, a plain DataLoader
becomes the runtime's resumable one (resumable.py) and litdata's StreamingDataLoader comes prepared (streaming.py), so
that a restarted job trains on exactly the samples the interrupted one had not reached; a loader of the project's own
(one with a state_dict) is left as it is. The validation, test and predict loaders that stream come prepared too: no
reader decodes a field with a decoder that can run code (decoders.py). Outside a job the same holds where
checkpoint.dirpath is given, since a rerun resumes from it; without it the project's loaders are Lightning's and
litdata's own. A resume with another batch or world size continues at the sample reached where the new batches allow
it, else says which samples it trains again (resumable.continued); Lightning's count of the epoch's batches follows.

    python app/example/train.py ... --checkpoint.dirpath ckpts     # a rerun resumes mid-epoch from last.ckpt
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

    def on_train_start(self, trainer, pl_module):
        """After a resume with another batch or world size (`resumed`: resumable.py, streaming.reshaped): Lightning's
        count of the epoch's batches done made the new shape's, since its epoch ends when that count reaches the
        loader's length (the old count would end it early, or run past it)."""
        combined = trainer.fit_loop._combined_loader
        for loader in combined.flattened if combined else []:
            if (resumed := getattr(loader, "resumed", None)) and resumed[0] == trainer.current_epoch:
                current = trainer.fit_loop.epoch_loop.batch_progress.current
                shift = resumed[1] - current.ready  # each counter as saved (completed may trail by one), moved
                current.ready, current.started = current.ready + shift, current.started + shift
                current.processed, current.completed = current.processed + shift, current.completed + shift
            if resumed:
                loader.resumed = None


def concern(ctx: Context) -> Part:
    """In a job, or where a rerun resumes from checkpoint.dirpath: the training loader wrapped, and a streamed one's
    epochs kept exact (StreamingEpochs). Anywhere: the decoders the project admits for streamed data
    (decoders.SETTING), handed to every check of the process."""
    decoders.admit(ctx.config.get(decoders.SETTING), os.environ)
    if not (ctx.plan.in_job or (ctx.model_checkpoint and ctx.model_checkpoint.dirpath)):
        return Part()
    # StreamingEpochs first: at the start of training it loads the states Lightning skipped, which TrainingLoader reads
    return Part(callbacks=[made(StreamingEpochs, ctx.pl)(ctx.plan.checkpoint_dir), made(TrainingLoader, ctx.pl)()])

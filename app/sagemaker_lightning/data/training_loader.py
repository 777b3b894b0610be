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

from sagemaker_lightning.data import decoders, draws
from sagemaker_lightning.data.resumable import ResumableEpoch, resumable
from sagemaker_lightning.data.streaming import StreamingEpochs, is_streaming, prepared
from sagemaker_lightning.lines import say
from sagemaker_lightning.toolbox.concern import Context, Part, Setting, declares
from sagemaker_lightning.toolbox.lightning_package import attribute, made

TRUSTED_FORMATS = Setting(  # data streamed with litdata (decoders.py)
    decoders.SETTING,
    list[str],
    [],
    "litdata decoders a streamed dataset may use beyond numbers, arrays, text and images "
    f"({', '.join(sorted(decoders.ADMITTED))}), e.g. [pickle]: each can run code that whoever can write the data's "
    "prefix or channel chose, so name one only where no one else can write it",
)


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
        """After a resume mid-epoch, Lightning's count of the epoch's batches done is made the loaders': the new
        shape's after a resume with another batch or world size (`resumed`: resumable.py, streaming.reshaped), since
        the epoch ends when that count reaches the loader's length (the old count would end it early, or run past it);
        0 where a training loader cannot resume mid-epoch (no state_dict: an IterableDataset's DataLoader, say),
        whose epoch starts again at its first batch: said in one line (else its last batches would be left out)."""
        combined = trainer.fit_loop._combined_loader
        loaders = combined.flattened if combined is not None else []  # its len() fails on an unsized loader
        # the count is the resumed epoch's only where Lightning restarts that epoch: a save after an epoch's end hooks
        # (a stop agreed between epochs) holds the finished epoch's count, which Lightning resets as the next begins
        done = trainer.fit_loop.epoch_loop.batch_progress.current.ready if trainer.fit_loop.restarting else 0
        if done and (plain := [loader for loader in loaders if not hasattr(loader, "state_dict")]):
            move(trainer, 0)
            if trainer.is_global_zero:
                say(restarted(trainer.current_epoch, done, plain[0]))
        # a step's random numbers (dropout) come from the seed, the epoch and the batch, as streamed ones make them
        # (the runtime's own loaders save the states), where a loader of the project's own, or one that cannot
        # resume, draws the batch
        own = [loader for loader in loaders if not (isinstance(loader, ResumableEpoch) or is_streaming(loader))]
        if own:
            self._seed = int(os.environ.get("PL_GLOBAL_SEED", 0))  # seed_everything's
            vars(self).pop("step_start", None)
        else:  # a step pays for step_start only where it seeds (toolbox/concern.py's Steps skips None)
            self.step_start = None
        for loader in loaders:
            if (resumed := getattr(loader, "resumed", None)) and resumed[0] == trainer.current_epoch:
                move(trainer, resumed[1])
            if resumed:
                loader.resumed = None

    def step_start(self, trainer, batch_idx):
        draws.seed_all(hash((self._seed, trainer.current_epoch, batch_idx)))

    def on_validation_start(self, trainer, pl_module):
        """A validation draws on the side: training's generators held, and set back at its end (draws.py), so that a
        run resumed from a checkpoint written just before one draws the same whether it repeats it or not."""
        draws.hold()

    def on_validation_end(self, trainer, pl_module):
        draws.release()

    def on_exception(self, trainer, pl_module, exception):
        """A validation ended by an exception: training's generators set back, and none left held in the process,
        where a later fit (a notebook's, a test's) would save that stale state before its first validation."""
        draws.release()


def move(trainer, batches: int) -> None:
    """Lightning's count of the epoch's batches done set to `batches`, each counter as saved (completed may trail)."""
    current = trainer.fit_loop.epoch_loop.batch_progress.current
    shift = batches - current.ready
    current.ready, current.started = current.ready + shift, current.started + shift
    current.processed, current.completed = current.processed + shift, current.completed + shift


def restarted(epoch: int, done: int, loader) -> str:
    """The line of a resume mid-epoch whose training loader cannot resume there."""
    what = type(loader).__name__
    if dataset := getattr(loader, "dataset", None):
        what += f" over {type(dataset).__name__}"
    return (
        f"resumed epoch {epoch} at batch {done}, but the training loader ({what}) cannot resume mid-epoch (it has no "
        f"state_dict): the epoch starts again at its first batch, and its first {done} batches on each rank are "
        "trained again; a DataLoader over a map-style dataset resumes exactly"
    )


@declares(TRUSTED_FORMATS)
def concern(ctx: Context) -> Part:
    """In a job, or where a rerun resumes from checkpoint.dirpath: the training loader wrapped, and a streamed one's
    epochs kept exact (StreamingEpochs). Anywhere: the decoders the project admits for streamed data
    (TRUSTED_FORMATS), handed to every check of the process."""
    decoders.admit(TRUSTED_FORMATS.of(ctx.config), os.environ)
    if not (ctx.plan.in_job or (ctx.model_checkpoint and ctx.model_checkpoint.dirpath)):
        return Part()
    # StreamingEpochs first: at the start of training it loads the states Lightning skipped, which TrainingLoader reads
    return Part(callbacks=[made(StreamingEpochs, ctx.pl)(ctx.plan.checkpoint_dir), made(TrainingLoader, ctx.pl)()])

"""The trained model in SageMaker's model directory (packed into model.tar.gz): after fit, global rank 0 writes
`model.pt` (the best checkpoint's weights as a state dict, read wherever the checkpoint was written, s3:// too; or the
final weights when no checkpoint was kept: under fsdp gathered from every rank's shards) and `config.yaml` (the
resolved configuration), then every rank waits for it: in local mode the job ends when the first container exits, and
all hosts share one model directory. When rank 0 fails to write it, every rank fails at once, not after a timeout.

The best checkpoint is read only inside checkpoint.dirpath (location.inside): its path comes from ModelCheckpoint's state,
which a resumed checkpoint sets (confine.confined drops paths elsewhere when the runtime resumes; this holds wherever a
fit resumed from).

model_dir is a local directory: its files are renamed into place, so model.pt is whole whenever it is there, which an
object store cannot promise; on SageMaker it is SM_MODEL_DIR, which SageMaker packs and uploads to the job's output.

    python app/example/train.py ... --model_dir out   # out/model.pt, out/config.yaml
"""

import os
from collections.abc import Callable

import torch

from sagemaker_lightning.checkpoints.atomic import replacing
from sagemaker_lightning.checkpoints.io import read
from sagemaker_lightning.checkpoints.layout import CONFIG, MODEL, sharding
from sagemaker_lightning.failure import UserError
from sagemaker_lightning.lines import say
from sagemaker_lightning.toolbox.location import inside, remote


def write(model_dir: str, state: dict, config_yaml: str) -> str:
    """Both files under partial names first; model.pt renamed last: its presence means the export is complete."""
    os.makedirs(model_dir, exist_ok=True)
    path = os.path.join(model_dir, MODEL)
    with replacing(path) as model, replacing(os.path.join(model_dir, CONFIG)) as config:
        with open(config, "w", encoding="utf-8") as f:
            f.write(config_yaml)
        torch.save(state, model)
    return path


def best_checkpoint(trainer) -> str:
    """The best checkpoint's path, "" for none or one outside checkpoint.dirpath (said on global rank 0). The same on
    every rank: under fsdp each gathers the final weights when there is none."""
    callback = trainer.checkpoint_callback
    best = callback.best_model_path if callback else ""
    dirpath = getattr(callback, "dirpath", None)
    if best and not (dirpath and inside(best, dirpath)):
        if trainer.is_global_zero:
            say(
                f"model: not reading the best checkpoint {best}: it is outside checkpoint.dirpath {dirpath} "
                "(a checkpoint's state named it); the final weights instead"
            )
        return ""
    return best


class Export:
    """Writes the model after a fit that ended normally (not stopped, not failed); see the module docstring."""

    BASE = "callbacks.Callback"

    def __init__(self, model_dir: str | None, config_yaml: Callable[[], str]):
        if model_dir and remote(model_dir):
            raise UserError(
                f"model_dir={model_dir} is not a local directory (model.pt is renamed into place there, which an "
                "object store cannot do); on SageMaker leave it unset (SageMaker uploads model.tar.gz to the job's "
                "output path), elsewhere give a local directory"
            )
        self.model_dir, self.config_yaml = model_dir, config_yaml

    def on_fit_end(self, trainer, pl_module):
        trainer.ckpt_path = None  # the resume applied to this fit; a later validate/test picks its own checkpoint
        best = best_checkpoint(trainer)
        # the final weights: under fsdp every rank gathers its shards, rank 0 gets the whole (fsdp.py)
        final = None
        if self.model_dir and not best:
            strategy = trainer.strategy
            final = strategy.full_state_dict(pl_module) if sharding(strategy) else pl_module.state_dict()
        failed = None
        if self.model_dir and trainer.is_global_zero:
            try:
                state = read(best)["state_dict"] if best else final
                path = write(self.model_dir, state, self.config_yaml())
                say(f"model: {path} from {best or 'the final weights'}")
            except Exception as e:
                failed = e
        # every rank waits here for rank 0's export, and learns whether it failed
        outcome = trainer.strategy.broadcast(failed and f"{type(failed).__name__}: {failed}", src=0)
        if failed is not None:
            raise UserError(
                f"could not write the model to model_dir={self.model_dir} ({type(failed).__name__}: {failed}); free "
                "space there or point model_dir elsewhere"
            ) from failed
        if outcome:
            raise UserError(f"global rank 0 could not write the model to model_dir ({outcome}); its log says more")

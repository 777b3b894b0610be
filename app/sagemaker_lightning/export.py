"""The trained model in SageMaker's model directory (packed into model.tar.gz): after fit, global rank 0 writes
`model.pt` (the best checkpoint's weights as a state dict, or the final weights when no checkpoint was kept: under
fsdp gathered from every rank's shards) and `config.yaml` (the resolved configuration), then every rank waits for
it: in local mode the job ends when the first container exits, and all hosts share one model directory.

    python app/example/train.py ... --model_dir out   # out/model.pt, out/config.yaml
"""

import os
from collections.abc import Callable

import torch

from sagemaker_lightning import sharding
from sagemaker_lightning.callbacks import say


def write(model_dir: str, state: dict, config_yaml: str) -> str:
    """Both files under temporary names first; model.pt renamed last: its presence means the export is complete."""
    os.makedirs(model_dir, exist_ok=True)
    writers = {"config.yaml": lambda f: f.write(config_yaml.encode()), "model.pt": lambda f: torch.save(state, f)}
    for name, write_to in writers.items():
        with open(os.path.join(model_dir, f".{name}.partial"), "wb") as f:
            write_to(f)
    for name in writers:
        os.replace(os.path.join(model_dir, f".{name}.partial"), os.path.join(model_dir, name))
    return os.path.join(model_dir, "model.pt")


class Export:
    """Writes the model after a fit that ended normally (not stopped, not failed); see the module docstring."""

    BASE = "callbacks.Callback"

    def __init__(self, model_dir: str | None, config_yaml: Callable[[], str]):
        self.model_dir, self.config_yaml = model_dir, config_yaml

    def on_fit_end(self, trainer, pl_module):
        trainer.ckpt_path = None  # the resume applied to this fit; a later validate/test picks its own checkpoint
        best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
        # the final weights: under fsdp every rank gathers its shards, rank 0 gets the whole (sharding.py)
        final = sharding.full_state_dict(trainer.strategy, pl_module) if self.model_dir and not best else None
        if self.model_dir and trainer.is_global_zero:
            state = torch.load(best, map_location="cpu", weights_only=False)["state_dict"] if best else final
            path = write(self.model_dir, state, self.config_yaml())
            say(f"model: {path} from {best or 'the final weights'}")
        trainer.strategy.barrier("exported")

"""Train the image classifier with LightningCLI: the same command line on a laptop, in Docker and on SageMaker.

Defaults come from trainer.yaml; every one can be overridden (`--key value`, as SageMaker passes hyperparameters).

    python scripts/make_dataset.py synthetic data/synthetic
    python app/train.py --data.data_dir data/synthetic --trainer.max_epochs 1 --trainer.accelerator cpu --model_dir out
"""

import hashlib
import os
import re
import socket
import sys
import traceback
import warnings

import pytorch_lightning as pl
import torch
from jsonargparse import ArgumentError
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.cli import LightningArgumentParser, LightningCLI
from pytorch_lightning.loggers import TensorBoardLogger
from pytorch_lightning.utilities.exceptions import MisconfigurationException

import sagemaker_env
from data import CIFAR10Base
from device_data import DeviceCIFAR10DataModule  # noqa: F401 (imported, so that --data finds it by its short name)
from failure import UserError, report
from model import ImageClassifier

TRAINER_YAML = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trainer.yaml")
# args= carries sys.argv plus SageMaker's settings; sys.argv itself must stay as it is, since Lightning's DDP
# launcher starts the other local ranks with it
warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")


def weights_digest(module: torch.nn.Module) -> str:
    """A short fingerprint of all weights: equal on every rank when data-parallel training kept them in sync."""
    h = hashlib.sha256()
    for tensor in module.state_dict().values():
        h.update(tensor.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


class RankReport(pl.Callback):
    """Each process says which rank it is at the start and which weights it ends with; rank 0 adds val metrics."""

    def _say(self, trainer: pl.Trainer, what: str) -> None:
        host = os.environ.get("SM_CURRENT_HOST", socket.gethostname())
        print(f"rank {trainer.global_rank}/{trainer.world_size} host {host}: {what}", flush=True)

    def setup(self, trainer, pl_module, stage):
        self._say(trainer, f"node_rank {trainer.node_rank} local_rank {trainer.local_rank}")

    def on_validation_epoch_end(self, trainer, pl_module):
        if trainer.is_global_zero and not trainer.sanity_checking:
            metrics = " ".join(f"{k}={v:.4f}" for k, v in sorted(trainer.callback_metrics.items()) if k.startswith("val/"))
            print(f"epoch {trainer.current_epoch} step {trainer.global_step}: {metrics}", flush=True)

    def on_fit_end(self, trainer, pl_module):
        self._say(trainer, f"weights {weights_digest(pl_module)}")


class CLI(LightningCLI):
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.add_class_arguments(TensorBoardLogger, "logger")
        parser.add_argument("--model_dir", type=str | None, default=None, help="where rank 0 writes model.pt and config.yaml")
        parser.link_arguments("data.init_args.num_classes", "model.num_classes")

    def instantiate_trainer(self, **kwargs) -> pl.Trainer:
        trainer = super().instantiate_trainer(logger=self.config_init["logger"], **kwargs)
        sagemaker_env.check_world_size(os.environ, trainer.num_nodes, trainer.num_devices)
        return trainer


def export(trainer: pl.Trainer, model: ImageClassifier, config_yaml: str, model_dir: str) -> None:
    """Rank 0 writes the best weights and the resolved config; in local mode all hosts share one model dir."""
    if not trainer.is_global_zero:
        return
    best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
    state = torch.load(best, map_location="cpu", weights_only=False)["state_dict"] if best else model.state_dict()
    os.makedirs(model_dir, exist_ok=True)
    for name, write in (("model.pt", lambda f: torch.save(state, f)), ("config.yaml", lambda f: f.write(config_yaml.encode()))):
        partial = os.path.join(model_dir, f".{name}.partial")
        with open(partial, "wb") as f:
            write(f)
        os.replace(partial, os.path.join(model_dir, name))  # never a half-written file under the final name
    print(f"model: {os.path.join(model_dir, 'model.pt')} from {best or 'the final weights'}", flush=True)


def argument_problem(message: str) -> str:
    """jsonargparse's nested union errors boiled down to `key=value is not valid (expected type)` or `key.option is not accepted by class`."""
    keys = re.findall(r'Parser key "([^"]+)"', message)
    option = re.search(r"class_path '([\w.]+)':\s*Option '(\w+)' is not accepted", message)
    if keys and option:  # e.g. --data.num_workers, an option of CIFAR10DataModule, given to DeviceCIFAR10DataModule
        return f"{'.'.join(keys)}.{option.group(2)} is not accepted by {option.group(1)}"
    value = re.search(r"(?:Got|Given) value: (.*?)(?: - |$)", message, re.M)
    if not keys or not value:
        return message  # e.g. "Unrecognized arguments: --trainer.max_epochz 1" says it already
    expected = [t.rsplit(".", 1)[-1] for t in re.findall(r"Expected an? <class '([\w.]+)'>", message) if t != "NoneType"]
    return f"{'.'.join(keys)}={value.group(1)} is not valid" + (f" (expected {expected[0]})" if expected else "")


def build_cli(argv: list[str]) -> CLI:
    """Parse trainer.yaml, then SageMaker's settings, then argv (later wins), and instantiate everything."""
    return CLI(
        ImageClassifier,
        CIFAR10Base,  # --data picks a pipeline by class name: DeviceCIFAR10DataModule or CIFAR10DataModule
        subclass_mode_data=True,
        args=sagemaker_env.trainer_args(os.environ, argv) + argv,
        run=False,
        parser_kwargs={"default_config_files": [TRAINER_YAML], "exit_on_error": False},
        trainer_defaults={"callbacks": [RankReport()]},
        save_config_kwargs={"overwrite": True},
    )


def run(argv: list[str]) -> None:
    try:
        cli = build_cli(argv)
    except (ValueError, TypeError, MisconfigurationException) as e:  # raised by a class built from the config
        raise UserError(f"bad configuration: {e}") from e
    dirpath = cli.config.checkpoint.dirpath
    last = os.path.join(dirpath, "last.ckpt") if dirpath else None
    resume = last if last and os.path.isfile(last) else None
    if resume:
        print(f"resuming from {resume}", flush=True)
    cli.trainer.fit(cli.model, cli.datamodule, ckpt_path=resume)
    if cli.config.model_dir:
        export(cli.trainer, cli.model, cli.parser.dump(cli.config, skip_unset=False), cli.config.model_dir)
    cli.trainer.strategy.barrier("exported")  # no host exits (ending a local-mode job) before rank 0 has written


def main(argv: list[str] | None = None) -> int:
    argv = sagemaker_env.sagemaker_values(sys.argv[1:] if argv is None else argv)
    try:
        run(argv)
    except UserError as e:
        return report(str(e))
    except ArgumentError as e:
        return report(f"bad hyperparameter: {argument_problem(str(e))}; python app/train.py --help lists them")
    except Exception as e:
        traceback.print_exc()
        return report(f"{type(e).__name__}: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
